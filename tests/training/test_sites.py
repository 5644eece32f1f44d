"""Where and why: every graph cut, host read, CPU fallback and compilation named with its cause and source line.

Each case runs tests/scripts/where.py in its own process with real torch_xla, and scrapes it over HTTP.
"""

from __future__ import annotations

import copy
import functools
import json

import pytest

from neuron_exporter import diagnosis
from tests.support.exposition import scrape, series, total
from tests.support.paths import SCRIPTS
from tests.support.processes import TrainingRun, marked_line

pytestmark = pytest.mark.training

STEPS = 6
SCRIPT = SCRIPTS / "where.py"


def line_of(site: str) -> str:
    return marked_line(SCRIPT, site)


def run(scenario: str, *args: str) -> tuple[str, dict]:
    """The scrape of one scenario and what its script printed, with its /diagnosis document under "diagnosis"."""
    return copy.deepcopy(scenario_run(scenario, *args))


@functools.cache
def scenario_run(scenario: str, *args: str) -> tuple[str, dict]:
    """Each scenario runs once per test session: several tests read the same run."""
    with TrainingRun("where.py", scenario, str(STEPS), *args) as process:
        result = process.result()
        exposition = scrape(result["url"]) if result["url"] else ""
        if result["url"]:
            result["diagnosis"] = json.loads(scrape(result["url"].replace("/metrics", "/diagnosis?format=json")))
        code, stderr = process.finish()
    assert code == 0 and "Traceback" not in stderr, stderr[-3000:]
    return exposition, result


@pytest.mark.parametrize(
    "scenario, cause", [("item", "item"), ("bool", "bool"), ("print", "print"), ("tolist", "tolist")]
)
def test_a_host_read_in_the_step_is_a_cut_named_by_cause_and_line(scenario, cause):
    exposition, xla = run(scenario)
    site = line_of(scenario)
    # labels sorted by name: (cause, location)
    assert series(exposition, "xla_host_reads_total") == {(cause, site): STEPS}
    (rank,) = xla["diagnosis"]["ranks"]
    assert {s["location"]: s["graph_cuts"] for s in rank["sites"] if s["graph_cuts"]} == {site: {cause: STEPS}}
    assert series(exposition, "xla_graph_cuts_total") == {(cause, site): STEPS}
    assert series(exposition, "xla_new_graphs_total") == {(site,): 1, (line_of("sync"),): 1}
    assert total(exposition, "xla_recompilations_total") == 0
    assert total(exposition, "xla_new_graphs_total") == xla["xla"]["UncachedCompile"]


def test_a_partial_sync_of_chosen_tensors_is_a_cut_named_at_its_line_but_no_host_read():
    # xm.save (like xm.mesh_reduce) syncs the tensors it is given through torch_xla's binding, not a Tensor method
    exposition, xla = run("save")
    assert series(exposition, "xla_graph_cuts_total") == {("sync_tensors", line_of("save")): STEPS}
    assert series(exposition, "xla_host_reads_total") == {}
    assert total(exposition, "xla_recompilations_total") == 0
    assert total(exposition, "xla_new_graphs_total") == xla["xla"]["UncachedCompile"]


@pytest.mark.parametrize(
    "scenario, ops",
    [
        ("lgamma", {"aten::lgamma", "aten::digamma"}),
        ("roi_align", {"torchvision::roi_align", "torchvision::_roi_align_backward"}),
    ],
)
def test_cpu_fallbacks_of_every_namespace_are_counted_and_their_cuts_named(scenario, ops):
    pytest.importorskip("torchvision") if scenario == "roi_align" else None
    exposition, xla = run(scenario)
    assert series(exposition, "xla_cpu_fallback_ops_total") == {(op,): STEPS for op in ops}
    # one cut per fallback operator per step (forward and backward), both from the C++ fallback: no Python line
    assert series(exposition, "xla_graph_cuts_total") == {("cpu_fallback", "unknown"): 2 * STEPS}
    assert total(exposition, "xla_recompilations_total") == 0
    assert series(exposition, "xla_cpu_fallback_site_info") == {}  # the probe is off by default
    assert "NEURON_EXPORTER_FALLBACK_SITES=1" in diagnosis.render_text(xla["diagnosis"])


@pytest.mark.parametrize(
    "scenario, forward, backward",
    [
        ("lgamma", "aten::lgamma", "aten::digamma"),
        ("roi_align", "torchvision::roi_align", "torchvision::_roi_align_backward"),
    ],
)
def test_the_fallback_probe_names_the_line_of_each_fallback_operator(scenario, forward, backward):
    pytest.importorskip("torchvision") if scenario == "roi_align" else None
    exposition, result = run(scenario, "--fallback-sites")
    # The forward call at its line (torchvision's own code is a site, named from its package root, with the script's
    # line among its frames); the backward one, from the autograd thread, at the line that called backward().
    (rank,) = result["diagnosis"]["ranks"]
    sites = {(s["op"], s["pass"]): s for s in rank["cpu_fallback_sites"]}
    assert set(sites) == {(forward, "forward"), (backward, "backward")}
    forward_site = sites[(forward, "forward")]
    if scenario == "roi_align":
        assert forward_site["location"].startswith("torchvision/ops/roi_align.py:")
        assert any(f"({line_of(scenario)})" in frame for frame in forward_site["frames"])
    else:
        assert forward_site["location"] == line_of(scenario)
    assert sites[(backward, "backward")]["location"] == line_of("backward")
    assert series(exposition, "xla_cpu_fallback_site_info") == {
        (forward_site["location"], forward, "forward"): 1,
        (line_of("backward"), backward, "backward"): 1,
    }
    text = diagnosis.render_text(result["diagnosis"])
    assert f"called at {forward_site['location']}" in text
    assert f"called from the backward pass of {line_of('backward')}" in text
    assert "NEURON_EXPORTER_FALLBACK_SITES" not in text  # the advice to turn it on, for operators it has not named
    # the step it watched is still counted, and its compilations are not taken for the job's
    assert series(exposition, "xla_cpu_fallback_ops_total") == {(forward,): STEPS, (backward,): STEPS}
    assert series(exposition, "xla_graph_cuts_total") == {("cpu_fallback", "unknown"): 2 * STEPS}
    assert total(exposition, "xla_recompilations_total") == 0
    assert total(exposition, "xla_steps_total") == STEPS


def test_every_way_of_ending_a_step_is_named_at_the_scripts_line():
    # xm.mark_step is wrapped by typing_extensions' deprecated in torch_xla 2.9, xm.optimizer_step(barrier=True) and
    # MpDeviceLoader sync inside torch_xla: the site is the script's line all the same, and so are the frames.
    exposition, result = run("markers")
    lines = [line_of(site) for site in ("mark_step", "torch_xla.sync", "loader", "optimizer_step")]
    # Each compiles at its own line: a new graph, or the same computation as an earlier loop's for its own batch
    # size (a recompilation).
    compiled = {**series(exposition, "xla_new_graphs_total"), **series(exposition, "xla_recompilations_total")}
    assert set(compiled) == {(line,) for line in lines}
    assert (
        total(exposition, "xla_new_graphs_total") + total(exposition, "xla_recompilations_total")
        == result["xla"]["UncachedCompile"]
    )
    (rank,) = result["diagnosis"]["ranks"]
    for site in rank["sites"]:
        assert site["frames"][0].endswith(f"({site['location']})"), site
        assert not any("typing_extensions" in frame or "torch_xla" in frame for frame in site["frames"]), site


def test_a_shape_that_changes_every_step_is_a_recompilation_at_the_step_marker():
    # The first graph is new; every later one is the same computation for another batch size, though a batch of 8
    # and one of 9 lower to graphs of 38 and 39 nodes.
    exposition, result = run("shapes")
    assert series(exposition, "xla_recompilations_total") == {(line_of("sync"),): STEPS - 1}
    assert series(exposition, "xla_new_graphs_total") == {(line_of("sync"),): 1}
    assert result["xla"]["UncachedCompile"] == STEPS
    # the detail: which upload changed shape, old -> new, at the last recompilation (batch size 8 + step)
    (rank,) = result["diagnosis"]["ranks"]
    (site,) = [s for s in rank["sites"] if s["location"] == line_of("sync")]
    last = site["recompilation_causes"][-1]["uploads"][line_of("upload")]
    assert last == {"before": f"({8 + STEPS - 2}, 16)", "now": f"({8 + STEPS - 1}, 16)"}
    assert site["frames"][0] == f"train_step ({line_of('sync')})"


def test_a_python_value_baked_into_the_graph_is_a_recompilation_with_no_upload_changed():
    # A single repeat with nothing changed cannot be told from a process settling in its first steps: the second
    # compilation is a new graph, every later one a recompilation.
    exposition, result = run("values")
    assert series(exposition, "xla_recompilations_total") == {(line_of("values sync"),): STEPS - 2}
    assert series(exposition, "xla_new_graphs_total") == {(line_of("values sync"),): 2}
    (rank,) = result["diagnosis"]["ranks"]
    (site,) = [s for s in rank["sites"] if s["location"] == line_of("values sync")]
    assert all(
        change["uploads"] == {} and "Python value" in change["cause"] for change in site["recompilation_causes"]
    ), site


def test_an_eval_loop_and_logging_steps_are_new_graphs_never_recompilations():
    exposition, xla = run("eval_logging")
    assert total(exposition, "xla_recompilations_total") == 0
    new = series(exposition, "xla_new_graphs_total")
    assert new[(line_of("logging"),)] >= 1 and new[(line_of("eval"),)] >= 1
    assert sum(new.values()) == xla["xla"]["UncachedCompile"]
    assert series(exposition, "xla_graph_cuts_total") == {("item", line_of("logging")): STEPS // 3}


@pytest.mark.parametrize(
    "scenario", ["item", "bool", "print", "tolist", "save", "lgamma", "roi_align", "shapes", "eval_logging"]
)
def test_torch_xla_compiles_and_executes_the_same_with_and_without_the_exporter(scenario):
    _, attached = run(scenario)
    _, bare = run(scenario, "--no-attach")
    keys = ("UncachedCompile", "CachedCompile", "ExecuteComputation", "MarkStep")
    assert {k: attached["xla"].get(k) for k in keys} == {k: bare["xla"].get(k) for k in keys}


def test_a_compiled_function_breaks_its_graph_the_same_with_and_without_the_exporter():
    _, attached = run("compile")
    _, bare = run("compile", "--no-attach")
    assert attached["graph_breaks"] == bare["graph_breaks"] == 1
