"""attach() in real torch_xla training loops on the CPU device, each in its own process, scraped over HTTP."""

from __future__ import annotations

import copy
import functools
import subprocess

import pytest

from tests.support.exposition import samples, scrape, total, uncatalogued, value
from tests.support.processes import TrainingRun

pytestmark = pytest.mark.training

STEPS = 6


def run_scenario(scenario: str, steps: int = STEPS) -> tuple[str, dict]:
    """Run one scenario; return the final scrape of its /metrics and the counters torch_xla itself reported."""
    return copy.deepcopy(scenario_run(scenario, steps))


@functools.cache
def scenario_run(scenario: str, steps: int) -> tuple[str, dict]:
    """Each scenario runs once per test session: several tests read the same run."""
    with TrainingRun("train_scenario.py", scenario, str(steps)) as run:
        result = run.result()
        exposition = scrape(result["url"])
        code, stderr = run.finish()
    assert code == 0, stderr
    return exposition, result["xla"]


def fallback_ops(exposition: str) -> dict[str, float]:
    return {
        dict(labels)["op"]: v
        for (name, labels), v in samples(exposition).items()
        if name == "xla_cpu_fallback_ops_total"
    }


def graphs_per_step_buckets(exposition: str) -> dict[str, float]:
    return {
        dict(labels)["le"]: v
        for (name, labels), v in samples(exposition).items()
        if name == "xla_graphs_per_step_bucket"
    }


def test_clean_loop_runs_one_graph_per_step_and_never_recompiles():
    exposition, xla = run_scenario("clean")
    assert value(exposition, "xla_steps_total", rank="0", local_rank="0") == STEPS
    assert graphs_per_step_buckets(exposition)["1.0"] == STEPS
    assert value(exposition, "xla_fragmented_steps_total") == 0
    assert total(exposition, "xla_recompilations_total") == 0
    assert value(exposition, "xla_compilations_total") == xla["UncachedCompile"] == 1
    assert value(exposition, "xla_graph_cache_hits_total") == xla["CachedCompile"] == STEPS - 1
    assert fallback_ops(exposition) == {}
    assert value(exposition, "xla_device_to_host_transfers_total") == 0


def test_item_before_the_step_end_makes_two_graphs_and_one_host_read_per_step():
    exposition, xla = run_scenario("item")
    buckets = graphs_per_step_buckets(exposition)
    assert (buckets["1.0"], buckets["2.0"]) == (0, STEPS)
    assert value(exposition, "xla_graphs_per_step_sum") == 2 * STEPS
    assert value(exposition, "xla_fragmented_steps_total") == STEPS
    assert value(exposition, "xla_device_to_host_transfers_total") == xla["TransferFromDeviceTime"] == STEPS
    assert value(exposition, "xla_host_scalar_reads_total") == STEPS
    assert fallback_ops(exposition) == {}, ".item() is a host read, never a CPU fallback"


def test_operator_without_lowering_is_named_and_counted_once_per_step():
    exposition, _ = run_scenario("fallback")
    # lgamma has no lowering; its backward, digamma, has none either.
    assert fallback_ops(exposition) == {"aten::lgamma": STEPS, "aten::digamma": STEPS}
    assert value(exposition, "xla_fragmented_steps_total") == STEPS
    assert value(exposition, "xla_steps_total") == STEPS


def test_changing_input_shape_recompiles_every_step_after_the_first():
    exposition, xla = run_scenario("shapes")
    assert value(exposition, "xla_compilations_total") == xla["UncachedCompile"] == STEPS
    assert total(exposition, "xla_recompilations_total") == STEPS - 1
    assert value(exposition, "xla_steps_total") == STEPS


@pytest.mark.parametrize(
    "scenario",
    ["mark_step", "sync", "prebound_sync", "step", "compile", "optimizer_step", "mp_device_loader", "parallel_loader"],
)
def test_every_step_ending_call_counts_one_step_per_call(scenario):
    exposition, xla = run_scenario(scenario, steps=4)
    assert value(exposition, "xla_steps_total") == 4
    # The extra syncs of torch_xla.step()/compile() and of the loaders ran no graph: seen, but not steps.
    assert value(exposition, "neuron_exporter_syncs_total") == xla["MarkStep"] >= 4


def test_attach_does_not_change_what_torch_xla_compiles_or_executes():
    _, with_exporter = run_scenario("item")
    with TrainingRun("train_scenario.py", "item", str(STEPS), "--no-attach") as bare:
        without = bare.result()["xla"]
        assert bare.finish()[0] == 0
    assert with_exporter == without
    assert with_exporter["ExecuteComputation"] == 2 * STEPS


def test_a_real_scrape_passes_promtool_check_metrics():
    exposition, _ = run_scenario("fallback")
    assert uncatalogued(exposition) == []
    check = subprocess.run(["promtool", "check", "metrics"], input=exposition, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    assert check.stdout + check.stderr == ""
