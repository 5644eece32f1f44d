"""attach() in a process that trains on TorchNeuron's ``neuron`` device, emulated on the CPU by the stand-in
``torch_neuronx`` (tests/support/torchneuron; torch 2.14: `make test-compile-latest PYTHON=python3.13`). Each count
is compared with what the stand-in itself recorded; a scrape and the exporter's hooks add no device sync."""

from __future__ import annotations

import json
import subprocess

import pytest

from neuron_exporter.diagnosis.advice import findings
from tests.support.exposition import samples, scrape, series, uncatalogued, value
from tests.support.paths import SCRIPTS
from tests.support.processes import TrainingRun, marked_line
from tests.support.torchneuron import emulation_problem

pytestmark = [
    pytest.mark.training,
    pytest.mark.neuron,
    pytest.mark.skipif(emulation_problem() is not None, reason=str(emulation_problem())),
]

STEPS = 5
SCRIPT = SCRIPTS / "neuron_train.py"


def run(*args: str) -> tuple[str, dict, list[int]]:
    """(a scrape, the script's own account with the rank's diagnosis document, the device's syncs before and after
    two scrapes and a diagnosis)."""
    with TrainingRun("neuron_train.py", str(STEPS), *args, fresh=True) as training:
        result = training.result(timeout=600)
        exposition = ""
        syncs = [_syncs(training)]
        if result["url"]:
            exposition = scrape(result["url"])
            scrape(result["url"])
            result["diagnosis"] = json.loads(scrape(result["url"].replace("/metrics", "/diagnosis?format=json")))
        syncs.append(_syncs(training))
        code, stderr = training.finish()
    assert code == 0 and "Traceback" not in stderr, stderr[-3000:]
    return exposition, result, syncs


def _syncs(training: TrainingRun) -> int:
    training.process.stdin.write("\n")
    training.process.stdin.flush()
    return training.result()["syncs"]


@pytest.fixture(scope="module")
def attached():
    return run("--attach", "--compile")


@pytest.fixture(scope="module")
def bare():
    return run("--compile")


def test_training_steps_are_exact(attached):
    exposition, result, _ = attached
    assert value(exposition, "training_steps_total") == result["optimizer_steps"] == STEPS


def test_an_operator_run_on_the_cpu_by_torchneuron_is_counted_per_call_with_its_lines(attached):
    exposition, result, _ = attached
    calls = series(exposition, "torchneuron_cpu_fallback_op_calls_total")
    assert calls == {("aten::digamma",): result["offloaded_calls"]["aten::digamma"]}
    assert result["offloaded_calls"]["aten::digamma"] == 2 * STEPS  # its own call, and lgamma's backward
    assert series(exposition, "torchneuron_cpu_fallback_site_info") == {  # (location, op, pass)
        (marked_line(SCRIPT, "digamma forward"), "aten::digamma", "forward"): 1,
        (marked_line(SCRIPT, "backward"), "aten::digamma", "backward"): 1,
    }


def test_an_operator_with_no_neuron_kernel_is_seen(attached):
    exposition, result, _ = attached
    seen = series(exposition, "torchneuron_cpu_fallback_ops_seen")
    assert seen == {(op,): 1 for op in result["fallback_ops"]}
    assert ("aten::lgamma.out",) in seen  # path a: only the set knows it, as its .out overload


def test_host_reads_are_counted_at_their_line(attached):
    exposition, _, _ = attached
    assert series(exposition, "torchneuron_host_reads_total") == {("item", marked_line(SCRIPT, "item")): STEPS}


def test_diagnose_lists_the_host_reads_that_wait_and_the_operators_with_their_lines(attached):
    _, result, _ = attached
    (rank,) = result["diagnosis"]["ranks"]
    item = marked_line(SCRIPT, "item")
    assert [site["device_waits"] for site in rank["sites"] if site["location"] == item] == [{"item": STEPS}]
    assert rank["cpu_fallback_ops"] == {"aten::digamma": 2 * STEPS}
    assert {(site["location"], site["pass"]) for site in rank["cpu_fallback_sites"]} == {
        (marked_line(SCRIPT, "digamma forward"), "forward"),
        (marked_line(SCRIPT, "backward"), "backward"),
    }
    titles = [title for _, title, _ in findings(result["diagnosis"])]
    assert f"{item}: {STEPS} host reads by .item() that wait for the device (rank 0)" in titles
    assert f"aten::digamma: runs on the CPU, {2 * STEPS} calls (rank 0)" in titles


def test_the_compile_cache_is_served_as_the_stand_in_recorded_it(attached):
    exposition, result, _ = attached
    cache = result["cache"]
    assert series(exposition, "torchneuron_compile_cache_hits_total") == {
        ("memory",): cache["in_memory_hits"],
        ("persistent",): cache["persistent_hits"],
    }
    assert cache["persistent_hits"] > 0
    assert value(exposition, "torchneuron_compile_cache_misses_total") == (
        cache["in_memory_misses"] - cache["persistent_hits"]
    )
    compilations = series(exposition, "torchneuron_compilations_total")
    assert sum(compilations.values()) == cache["total_compilations"]
    assert compilations[("graph",)] == 4  # forward and backward, batch 8 then 12; the rest are eager kernels
    seconds = series(exposition, "torchneuron_compile_seconds_total")
    assert sum(seconds.values()) == pytest.approx(cache["total_compilation_time_ms"] / 1000)


def test_compiled_graphs_and_a_failed_one_with_its_reason(attached):
    exposition, result, _ = attached
    assert value(exposition, "torchneuron_compiled_graphs_total") == result["neuron_counters"]["compiled_graphs"]
    assert series(exposition, "torchneuron_graph_fallbacks_total") == {
        ("NRT execution failed: NEFF load error (code N)",): 1
    }


def test_device_memory_is_served(attached):
    exposition, result, _ = attached
    memory = result["memory"]
    assert value(exposition, "torchneuron_memory_allocated_bytes") == memory["allocated_bytes.current"]
    assert value(exposition, "torchneuron_memory_active_peak_bytes") == memory["active_bytes.peak"] > 0
    assert value(exposition, "torchneuron_memory_ooms_total") == memory["num_ooms"]
    assert value(exposition, "torchneuron_memory_alloc_retries_total") == memory["num_alloc_retries"]


def test_every_record_is_readable(attached):
    exposition, _, _ = attached
    readable = series(exposition, "neuron_exporter_torchneuron_readable")
    assert readable and set(readable.values()) == {1.0}
    assert uncatalogued(exposition) == []


def test_the_exporter_adds_no_device_sync(attached, bare):
    _, attached_result, attached_syncs = attached
    _, bare_result, bare_syncs = bare
    assert attached_syncs[0] == attached_syncs[1]  # two scrapes: none
    assert attached_result["syncs"] == bare_result["syncs"] > 0  # training, attached or not: the same


def test_no_xla_series_in_a_torchneuron_process(attached):
    exposition, result, _ = attached
    assert not result["torch_xla_loaded"]
    assert not [name for (name, _) in samples(exposition) if name.startswith("xla_")]


def test_the_scrape_passes_promtool_check_metrics(attached):
    exposition, _, _ = attached
    check = subprocess.run(["promtool", "check", "metrics"], input=exposition, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
