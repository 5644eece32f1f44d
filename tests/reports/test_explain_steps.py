"""``explain`` counts steps as well as a report allows, and says how: against real runs whose steps were counted.

The fixtures were captured with a wrapper around torch_xla._XLAC._xla_step_marker that counted the step markers
that ran a graph (``markers_with_graph`` in the truth files). A report holds no such count: MarkStep counts every
sync, including the empty ones of torch_xla.step(), torch_xla.compile() and MpDeviceLoader.
"""

from __future__ import annotations

import itertools
import json
import random
import re

import pytest

from neuron_exporter.reports.explain import explain
from neuron_exporter.reports.report_parser import parse_report, parse_report_stream
from neuron_exporter.reports.step_count import SyncHistory, step_count
from neuron_exporter.snapshot import Snapshot
from tests.support.paths import FIXTURES as TEST_FIXTURES

FIXTURES = TEST_FIXTURES / "reports"
SCENARIOS = sorted(path.name.removesuffix(".truth.json") for path in FIXTURES.glob("*.truth.json"))
EMPTY_SYNC_SCENARIOS = ("compile_loader", "compile_loader_fallback", "step_item", "step_item_after")


def truth(scenario: str) -> dict:
    return json.loads((FIXTURES / f"{scenario}.truth.json").read_text())


def explained(name: str) -> str:
    return explain(parse_report((FIXTURES / name).read_text(), name))


def explained_dump(name: str) -> str:
    history, snapshot = SyncHistory(), None
    for step, snapshot in parse_report_stream((FIXTURES / name).read_text(), name):
        history.add(step, snapshot)
    return explain(snapshot, history)


def overview(text: str, label: str) -> str:
    return re.search(rf"^  {re.escape(label)}:\s+(.*)$", text, re.MULTILINE).group(1)


def steps_of(text: str) -> int:
    return int(overview(text, "markers that ran graphs").split()[0])


def graphs(expected: dict) -> int:
    return expected["counters"].get("CachedCompile", 0) + expected["counters"]["UncachedCompile"]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_steps_are_the_markers_that_ran_a_graph(scenario):
    expected = truth(scenario)
    text = explained(f"{scenario}.report.txt")
    assert steps_of(text) == expected.get("markers_with_graph", expected["steps"]) == expected["steps"]
    per_step = graphs(expected) / expected["steps"]
    assert overview(text, "graphs run").endswith(f"; {per_step:.1f} per step marker")
    assert "A report knows nothing of optimizer steps" in text


@pytest.mark.parametrize("scenario", EMPTY_SYNC_SCENARIOS)
def test_markers_are_not_steps(scenario):
    expected = truth(scenario)
    text = explained(f"{scenario}.report.txt")
    assert overview(text, "step markers (MarkStep)").startswith(f"{expected['markers']}, every sync")
    extra = expected["markers"] - expected["steps"]
    assert extra > 0
    assert (
        f"The {expected['markers']} step markers (MarkStep) count every sync, also those that ran no graph"
        in " ".join(text.split())
    )


def test_compile_and_loader_loop_is_clean():
    """13 steps of torch_xla.compile() over MpDeviceLoader: 41 syncs, 13 graphs, nothing wrong."""
    text = explained("compile_loader.report.txt")
    assert overview(text, "markers that ran graphs") == "13 (step markers that ran a graph; see Steps)"
    assert overview(text, "step markers (MarkStep)").startswith("41,")
    assert "Nothing wrong found" in text and "Findings" not in text


def test_three_graphs_per_step_behind_empty_syncs():
    """Fallbacks cut each step in three; the 26 markers of compile() and the loader hide it from a graphs/MarkStep."""
    expected = truth("compile_loader_fallback")
    assert graphs(expected) / expected["counters"]["MarkStep"] < 1  # what dividing by MarkStep would say
    text = explained("compile_loader_fallback.report.txt")
    flat = " ".join(text.split())
    assert "Graph fragmentation: 3.0 graphs per step marker (24 graphs in 8 step markers)" in text
    assert "1.0 graphs per step" not in flat and "0.9 graphs per step" not in flat
    assert overview(text, "markers that ran graphs") == "8 (graphs that no host read explains; see Steps)"
    assert "8 steps: the graphs that no host read explains (24 graphs - 16 host reads)." in flat
    assert "there were more steps, up to 24." in flat  # the other reading, said as such


def test_item_inside_torch_xla_step():
    text = explained("step_item.report.txt")
    flat = " ".join(text.split())
    assert overview(text, "markers that ran graphs").startswith("8 ")
    assert "Graph fragmentation: 2.0 graphs per step marker (16 graphs in 8 step markers)" in text
    assert "1. Host reads: the host read device values 8 times (1.0 per step marker)" in text
    assert "If some host reads came after their step had ended, there were more steps (up to 16)" in flat


def test_item_after_torch_xla_step_is_no_fragmentation():
    text = explained("step_item_after.report.txt")
    flat = " ".join(text.split())
    assert overview(text, "markers that ran graphs") == "8 (one per graph, at most one per step marker; see Steps)"
    assert "Graph fragmentation" not in text
    assert "so they are taken as reads after their step had ended" in flat
    assert "1. Host reads: the host read device values 8 times (1.0 per step marker)" in text


# ----- XLA_METRICS_FILE dumps: a report per sync


def test_dump_counts_the_syncs_that_ran_a_graph():
    text = explained_dump("metrics_file.step_item.txt")
    flat = " ".join(text.split())
    assert overview(text, "markers that ran graphs") == "4 (syncs that ran a graph, from the dump; see Steps)"
    assert "counted over the 8 reports of the XLA_METRICS_FILE dump, one per sync" in flat
    assert "The other 4 of the 8 step markers (MarkStep) ran no graph" in flat
    assert "Graph fragmentation: 2.0 graphs per step marker (8 graphs in 4 step markers)" in text


def dump_reports(name: str) -> list[tuple[int | None, Snapshot]]:
    return list(parse_report_stream((FIXTURES / name).read_text(), name))


def history_of(reports) -> SyncHistory:
    history = SyncHistory()
    for step, snapshot in reports:
        history.add(step, snapshot)
    return history


def test_dump_cut_at_the_front_is_not_used():
    reports = dump_reports("metrics_file.step_item.txt")
    assert history_of(reports).usable and history_of(reports).syncs_with_graph == 4
    assert not history_of(reports[1:]).usable  # the graphs before the first report are unknown
    assert not history_of(reports[::2]).usable  # not one report per sync
    text = explain(reports[-1][1], history_of(reports[3:]))
    assert "from the dump" not in text and overview(text, "markers that ran graphs").startswith("4 ")
    # counted from the last report
    assert "The reports of the XLA_METRICS_FILE dump were not used to count steps" in " ".join(text.split())


def test_dump_of_two_runs_counts_the_last():
    first, second = dump_reports("metrics_file.fallback.txt"), dump_reports("metrics_file.step_item.txt")
    history = history_of(first + second)
    assert (history.usable, history.reports, history.syncs_with_graph) == (True, 8, 4)
    history = history_of(second + first)
    assert (history.usable, history.reports, history.syncs_with_graph) == (True, 3, 3)


# ----- the rule, on counts


@pytest.mark.parametrize(
    "markers, graphs, host_reads, steps, alternative",
    [
        (8, 8, 0, 8, None),  # a plain loop
        (8, 16, 8, 8, None),  # .item() before the sync: the bounds agree
        (41, 13, 0, 13, None),  # torch_xla.compile() over MpDeviceLoader
        (16, 16, 8, 8, 16),  # .item() inside torch_xla.step(): taken as cuts, one read per step
        (26, 24, 16, 8, 24),  # fallbacks behind compile() and the loader
        (16, 8, 8, 8, None),  # .item() after torch_xla.step(): cannot all be cuts
        (20, 11, 1, 11, 10),  # one read in ten steps: taken as a read after the step's end
        (8, 10, 0, 8, None),  # more graphs than markers with no host read: 2 ran neither way
    ],
)
def test_step_count_rule(markers, graphs, host_reads, steps, alternative):
    count = step_count(markers, graphs, host_reads)
    assert (count.steps, count.alternative) == (steps, alternative)


def test_step_count_without_markers_or_graphs():
    assert step_count(0, 5, 0).steps == 0 and "no MarkStep counter" in step_count(0, 5, 0).explanation[0]
    assert step_count(5, 0, 0).steps == 0 and "No graph ran" in step_count(5, 0, 0).explanation[0]


def test_step_count_stays_within_what_the_report_allows():
    rng = random.Random(7)
    cases = itertools.chain(
        itertools.product(range(6), repeat=3),
        ((rng.randrange(10**6), rng.randrange(10**6), rng.randrange(10**6)) for _ in range(2000)),
    )
    for markers, graphs, host_reads in cases:
        count = step_count(markers, graphs, host_reads)
        if markers and graphs:
            assert max(graphs - host_reads, 0) <= count.steps or count.steps == min(markers, graphs)
            assert 0 < count.steps <= min(markers, graphs), (markers, graphs, host_reads)
        else:
            assert count.steps == 0
        assert count.alternative is None or count.alternative != count.steps


def test_short_report_counts_compilations_from_compile_time():
    text = explained("step_item.short.txt")  # no UncachedCompile counter in a short report
    full = explained("step_item.report.txt")
    assert overview(text, "graphs run") == overview(full, "graphs run")
    assert overview(text, "markers that ran graphs") == overview(full, "markers that ran graphs")
    assert "This is a short_metrics_report()" in text and "This is a short_metrics_report()" not in full
