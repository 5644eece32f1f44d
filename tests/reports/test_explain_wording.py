"""``explain`` says only what a report supports: on every captured report, and on counts made up to reach each case."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from neuron_exporter.reports import findings as findings_module
from neuron_exporter.reports.explain import explain
from neuron_exporter.reports.findings import findings
from neuron_exporter.reports.report_parser import parse_report_stream
from neuron_exporter.reports.step_count import SyncHistory
from neuron_exporter.snapshot import SECONDS, MetricValue, Snapshot
from tests.support.paths import FIXTURES as TEST_FIXTURES

FIXTURES = TEST_FIXTURES / "reports"
REPORTS = (
    sorted(FIXTURES.glob("*.report.txt"))
    + sorted(FIXTURES.glob("*.short.txt"))
    + sorted(FIXTURES.glob("metrics_file.*.txt"))
)


def explained(path: Path) -> str:
    history, snapshot = SyncHistory(), None
    for step, snapshot in parse_report_stream(path.read_text(), path.name):
        history.add(step, snapshot)
    return explain(snapshot, history)


def sections(text: str) -> list[tuple[str, str]]:
    """(title, body) of each finding."""
    parts = re.split(r"^\d+\. (.+)$", text, flags=re.MULTILINE)
    return list(zip(parts[1::2], parts[2::2], strict=False))


def snapshot(markers: int, cached: int, uncached: int, transfers: int = 0, **counters: int) -> Snapshot:
    names = {name.replace("__", "::"): value for name, value in counters.items()}
    metrics = {
        "CompileTime": MetricValue(uncached, 0.5 * uncached, SECONDS),
        "ExecuteTime": MetricValue(cached + uncached, 0.01 * (cached + uncached), SECONDS),
    }
    if transfers:
        metrics["TransferFromDeviceTime"] = MetricValue(transfers, 0.001 * transfers, SECONDS)
    return Snapshot({"MarkStep": markers, "CachedCompile": cached, "UncachedCompile": uncached, **names}, metrics)


@pytest.mark.parametrize("report", REPORTS, ids=lambda path: path.name)
def test_no_claim_the_report_cannot_support(report):
    text = explained(report)
    flat = " ".join(text.split())
    titles = [title for title, _ in sections(text)]
    assert not [title for title in titles if "ecompil" in title]  # a recompilation cannot be told from a new graph
    assert ".item() calls above" not in flat
    for index, (title, body) in enumerate(sections(text)):
        if "operators above" in " ".join(body.split()):
            assert any(earlier.startswith("CPU fallback:") for earlier in titles[:index]), title
        if title.startswith("Compilations after the first steps"):
            assert "Pad inputs" not in body and " pad inputs" not in body.replace("For shapes that change: pad", "")
    assert re.search(r"^Steps$", text, re.MULTILINE)


def test_item_calls_below_the_host_read_threshold_are_named_without_above():
    # 20 steps, 4 of them cut by an .item() before the sync
    found = findings(snapshot(markers=20, cached=22, uncached=2, transfers=4, aten___local_scalar_dense=4))
    titles = [finding.title for finding in found]
    assert titles == ["Graph fragmentation: 1.2 graphs per step marker (24 graphs in 20 step markers)"]
    cause = found[0].details[1]
    assert cause == "The report has .item() calls: each cuts the graph when it needs a value before the step's end."


def test_fragmentation_without_host_reads_does_not_blame_them():
    found = findings(snapshot(markers=8, cached=14, uncached=2))
    assert [finding.title for finding in found] == [
        "Graph fragmentation: 2.0 graphs per step marker (16 graphs in 8 step markers)"
    ]
    assert found[0].details[1].startswith("The report has no host read, so no .item(), print or CPU fallback")


def test_custom_operator_is_a_fallback_with_advice_for_its_library():
    text = explain(snapshot(markers=10, cached=19, uncached=1, transfers=10, mylib__op=10))
    assert re.search(r"^\s+mylib::op\s+10\s+\(1\.0 per step marker\)$", text, re.MULTILINE)
    assert "1. CPU fallback: 1 operator without an XLA lowering ran on the CPU" in text
    assert "An operator of another library (mylib::)" in " ".join(text.split())
    assert "If you need an aten:: operator" not in text
    assert "Host reads:" not in text  # its 10 copies are the fallback's


def test_compilations_after_the_first_steps_name_both_causes():
    found = findings(snapshot(markers=100, cached=80, uncached=20))
    (late,) = found
    assert late.title == "Compilations after the first steps: 19 (20 compilations in 100 step markers)"
    text = " ".join(late.details + late.next_steps)
    assert "cannot say why a graph was compiled" in text
    assert "the same code ran with new shapes" in text and "a new graph: an evaluation loop" in text
    assert [step.split(":")[0] for step in late.next_steps[:3]] == [
        "Find out which",
        "For shapes that change",
        "For new graphs",
    ]


def test_a_few_compilations_after_warm_up_are_no_finding():
    assert findings(snapshot(markers=100, cached=97, uncached=3)) == []  # e.g. the optimizer's state at step 2


def test_no_step_markers():
    text = explain(snapshot(markers=0, cached=3, uncached=1, aten___local_scalar_dense=2, transfers=2))
    assert "markers that ran graphs: unknown (no step markers)" in text
    assert "The report has no MarkStep counter" in text
    assert "1. Host reads: the host read device values 2 times (no per-step figure)" in text


def test_explain_judges_by_the_thresholds_of_the_alerts():
    """One configuration: explain reads a saved report with the defaults the alerts fire at."""
    from neuron_exporter.mixin.config import DEFAULTS

    assert findings_module.HOST_READS_PER_STEP == DEFAULTS.host_reads_per_step
    assert findings_module.LATE_COMPILES_PER_STEP == DEFAULTS.recompilations_per_step
