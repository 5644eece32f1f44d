"""attach() in a PyTorch process that never imports torch_xla: a compiled nn.Module trained with AdamW on the CPU,
scraped over HTTP, and the same script under `neuron-exporter run` with no line of the exporter in it. Runs in any
environment with torch (with torch_xla installed or not: nothing imports it)."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from tests.support.exposition import samples, scrape, value
from tests.support.paths import SCRIPTS
from tests.support.processes import TrainingRun, wait_until

pytestmark = [pytest.mark.training, pytest.mark.compile]

STEPS = 6
CLI = [sys.executable, "-m", "neuron_exporter"]


@pytest.fixture(scope="module")
def compiled_run():
    with TrainingRun("compiled_train.py", str(STEPS), "--attach", fresh=True) as run:
        result = run.result(timeout=600)
        exposition = scrape(result["url"])
        code, stderr = run.finish()
    assert code == 0 and "Traceback" not in stderr, stderr[-3000:]
    return exposition, result


def test_training_steps_are_the_optimizer_steps_each_with_its_duration(compiled_run):
    exposition, result = compiled_run
    assert value(exposition, "training_steps_total") == result["optimizer_steps"] == STEPS
    assert value(exposition, "training_step_duration_seconds_count") == STEPS
    assert value(exposition, "training_step_duration_seconds_sum") > 0


def test_compilations_are_dynamos_own_and_torch_xla_is_never_loaded(compiled_run):
    exposition, result = compiled_run
    assert not result["torch_xla_loaded"]
    compilations = sum(v for (name, _), v in _samples(exposition) if name == "torch_compile_compilations_total")
    recompilations = sum(v for (name, _), v in _samples(exposition) if name == "torch_compile_recompilations_total")
    assert (compilations, recompilations) == (result["compiled"], result["recompiled"]) == (2, 1)
    assert not [name for (name, _), _ in _samples(exposition) if name.startswith("xla_")]
    assert value(exposition, "training_process_threads") >= 1
    assert value(exposition, "training_process_resident_memory_bytes") > 0


def test_the_scrape_passes_promtool_check_metrics(compiled_run):
    exposition, _ = compiled_run
    check = subprocess.run(["promtool", "check", "metrics"], input=exposition, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


def test_neuron_exporter_run_attaches_a_compiled_script_with_no_line_of_the_exporter(tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    process = subprocess.Popen(
        CLI
        + [
            "run",
            "--addr",
            "127.0.0.1",
            "--port",
            str(port),
            "--spool-dir",
            str(tmp_path / "spool"),
            "--",
            sys.executable,
            str(SCRIPTS / "compiled_train.py"),
            str(STEPS),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(lambda: _steps(url) == STEPS, timeout=300, what="the steps of the compiled script")
        text = scrape(url)
        compilations = [v for (name, labels), v in _samples(text) if name == "torch_compile_compilations_total"]
        assert sum(compilations) >= 1, text
        assert value(text, "training_step_duration_seconds_count", rank="0") == STEPS
        _, stderr = process.communicate(input="", timeout=120)
    finally:
        process.kill()
    assert process.returncode == 0 and "Traceback" not in stderr, stderr[-3000:]


def _steps(url: str) -> float | None:
    try:
        return value(scrape(url), "training_steps_total", rank="0")
    except OSError:
        return None


def _samples(exposition: str):
    return samples(exposition).items()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
