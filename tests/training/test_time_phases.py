"""``training_time_seconds_total{phase}`` against a training loop's own clocks, on torch_xla, inductor and the emulated
TorchNeuron device: a Dataset that sleeps, a checkpoint saved and loaded before training and saved after, timed host
reads, recompilations; the phases sum to the wall time."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.exposition import scrape, value
from tests.support.paths import SCRIPTS
from tests.support.processes import run_python, wait_until, xla_env
from tests.support.torchneuron import emulation_problem

try:
    import torch_xla  # noqa: F401

    HAS_XLA = True
except ImportError:
    HAS_XLA = False

TOLERANCE, FLOOR = 0.15, 0.1  # a phase matches the script's clock within 15% or 0.1 s


def run(backend: str) -> dict:
    done = run_python(SCRIPTS / "time_phases_train.py", backend, env=xla_env(), timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.training
@pytest.mark.parametrize(
    "backend",
    [
        pytest.param("xla", marks=pytest.mark.skipif(not HAS_XLA, reason="torch_xla is not installed")),
        pytest.param("inductor", marks=pytest.mark.compile),
        pytest.param(
            "neuron",
            marks=[
                pytest.mark.neuron,
                pytest.mark.skipif(emulation_problem() is not None, reason=str(emulation_problem())),
            ],
        ),
    ],
)
def test_each_phase_matches_the_scripts_own_clock_and_they_sum_to_the_wall_time(backend):
    if backend == "inductor" and sys.platform != "linux":
        pytest.skip("inductor needs a C compiler")
    result = run(backend)
    exported, clocks = result["exported"], result["clocks"]
    for phase, clock in clocks.items():
        assert abs(exported[phase] - clock) <= max(TOLERANCE * clock, FLOOR), (phase, exported, clocks)
    assert clocks["data"] > 1.0 and clocks["checkpoint"] > 0  # the script's sleeps and saves were there to see
    startup = result["startup"]
    assert abs(exported["startup"] - startup) <= max(TOLERANCE * startup, FLOOR), (exported, result)
    assert exported["step"] > 0 and exported["other"] <= result["after_last_step"] + clocks["checkpoint"]
    # diagnose and /diagnosis open with the run's goodput and its largest badput phases.
    goodput = result["diagnosis"].splitlines()[1]
    assert goodput.startswith("Run ") and ", 1 rank: goodput 0." in goodput and " | " in goodput, goodput
    assert all(exported[phase] >= value for phase, value in result["before_detach"].items())  # never backwards
    total = sum(exported.values())  # counted to the end of detach(), which began at wall_to_detach_start
    assert result["wall_to_detach_start"] <= total <= result["wall_to_detach_end"] * 1.01, (total, result)


@pytest.mark.training
@pytest.mark.compile
def test_a_long_torch_compile_is_served_as_compile_while_it_runs(tmp_path):
    """Not all at once when it ends: a dashboard and the goodput alert see a half-hour first compile as it goes."""
    release = tmp_path / "release"
    process = subprocess.Popen(
        [sys.executable, str(SCRIPTS / "long_compile.py"), str(release)],
        env=xla_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        url = json.loads(process.stdout.readline())["url"]

        def compile_seconds() -> float:
            return value(scrape(url), "training_time_seconds_total", phase="compile") or 0.0

        first = wait_until(compile_seconds, timeout=120, interval=0.2, what="compile time served while compiling")
        wait_until(lambda: compile_seconds() >= first + 1.0, timeout=60, interval=0.2, what="the compile to go on")
        assert process.poll() is None and not release.exists()  # still compiling, as the script cannot go on
        release.touch()
        _, stderr = process.communicate(timeout=120)
        assert process.returncode == 0, stderr[-3000:]
    finally:
        release.touch()
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.mark.training
@pytest.mark.skipif(not HAS_XLA, reason="torch_xla is not installed")
def test_a_long_torch_xla_compile_is_served_as_compile_while_the_step_marker_runs():
    """torch_xla tells a compilation's time only when it ends (a CompileTime sample); while the step marker still
    compiles, the scrapes see how long it has run so far, and the end adds only the rest."""
    done = run_python(SCRIPTS / "long_xla_compile.py", env=xla_env(), timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    growing = [seconds for seconds in result["during"] if seconds > 0]
    assert len(growing) >= 2 and growing == sorted(growing), result["during"]
    assert growing[-1] <= result["exported"]
    compile_time = result["compile_time"]
    assert abs(result["exported"] - compile_time) <= max(TOLERANCE * compile_time, FLOOR), result


@pytest.mark.training
@pytest.mark.skipif(not HAS_XLA, reason="torch_xla is not installed")
def test_a_child_forked_while_a_thread_reads_the_ledger_still_reads_its_own():
    done = run_python(SCRIPTS / "fork_while_reading.py", env=xla_env(), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"child": 0}


@pytest.mark.training
def test_a_loaders_worker_start_is_data_and_an_async_save_and_the_wait_on_it_are_checkpoint():
    done = run_python(SCRIPTS / "phase_reach.py", env=xla_env(), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    exported, clocks, parts = result["exported"], result["clocks"], result["parts"]
    assert parts["iter"] > FLOOR and parts["wait"] > FLOOR  # what the phases did not reach before is worth seeing
    for phase in ("data", "checkpoint"):
        assert abs(exported[phase] - clocks[phase]) <= max(TOLERANCE * clocks[phase], FLOOR / 2), result
