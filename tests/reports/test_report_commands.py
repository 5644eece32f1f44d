"""``neuron-exporter parse`` and ``neuron-exporter explain``, run as a user runs them, on captured reports."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from tests.support.exposition import samples, value
from tests.support.paths import FIXTURES as TEST_FIXTURES
from tests.support.paths import ROOT
from tests.support.processes import xla_env

FIXTURES = TEST_FIXTURES / "reports"
REPORTS = (
    sorted(FIXTURES.glob("*.report.txt"))
    + sorted(FIXTURES.glob("*.short.txt"))
    + sorted(FIXTURES.glob("metrics_file.*.txt"))
)


def neuron_exporter(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "neuron_exporter", *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=xla_env(),
        cwd=ROOT,
        timeout=120,
    )


def truth(scenario: str) -> dict:
    return json.loads((FIXTURES / f"{scenario}.truth.json").read_text())


def ok(*args: str, stdin: str | None = None) -> str:
    result = neuron_exporter(*args, stdin=stdin)
    assert (result.returncode, result.stderr) == (0, "")
    return result.stdout


def fails(*args: str) -> str:
    """The one-line error of a command that must fail with exit code 2."""
    result = neuron_exporter(*args)
    assert result.returncode == 2
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1
    return result.stderr


# ----- parse


def test_parse_fallback_report_to_prometheus():
    exposition = ok("parse", str(FIXTURES / "fallback.report.txt"), "--rank", "3")
    counters, metrics = truth("fallback")["counters"], truth("fallback")["metrics"]
    rank = {"rank": "3", "local_rank": "3"}
    ops = {dict(labels)["op"] for (name, labels) in samples(exposition) if name == "xla_cpu_fallback_ops_total"}
    assert ops == {"aten::digamma", "aten::lgamma"}
    assert value(exposition, "xla_cpu_fallback_ops_total", op="aten::lgamma", **rank) == counters["aten::lgamma"]
    assert value(exposition, "xla_compilations_total", **rank) == counters["UncachedCompile"]
    assert value(exposition, "xla_graph_cache_hits_total", **rank) == counters["CachedCompile"]
    assert value(exposition, "xla_graph_executions_total", **rank) == metrics["ExecuteTime"][0]
    assert value(exposition, "xla_device_to_host_transfers_total", **rank) == metrics["TransferFromDeviceTime"][0]
    assert value(exposition, "xla_compile_seconds_total", **rank) == pytest.approx(
        metrics["CompileTime"][1] / 1e9, abs=1e-9
    )
    assert value(exposition, "xla_host_scalar_reads_total", **rank) == 0
    assert all(dict(labels).get("rank") == "3" for _, labels in samples(exposition))


def test_parse_counts_item_as_a_host_read_never_as_a_fallback():
    exposition = ok("parse", str(FIXTURES / "item.report.txt"))
    assert (
        value(exposition, "xla_host_scalar_reads_total", rank="0", local_rank="0")
        == truth("item")["counters"]["aten::_local_scalar_dense"]
    )
    assert not [key for key in samples(exposition) if "aten::_local_scalar_dense" in dict(key[1]).values()]
    assert not [key for key in samples(exposition) if key[0] == "xla_cpu_fallback_ops_total"]


def test_parse_torchvision_operators_are_cpu_fallbacks():
    exposition = ok("parse", str(FIXTURES / "torchvision.report.txt"))
    counters = truth("torchvision")["counters"]
    fallback = {
        dict(labels)["op"]: v
        for (name, labels), v in samples(exposition).items()
        if name == "xla_cpu_fallback_ops_total"
    }
    # torch_xla's own list of the operators it ran on the CPU, read in the same run
    assert set(fallback) == set(truth("torchvision")["executed_fallback_ops"])
    assert fallback == {name: counters[name] for name in fallback}
    events = {dict(labels)["counter"] for (name, labels) in samples(exposition) if name == "xla_events_total"}
    assert not [counter for counter in events if "::" in counter]


def test_parse_custom_operators_are_cpu_fallbacks(tmp_path):
    report = tmp_path / "report.txt"
    report.write_text(
        "Counter: MarkStep\n  Value: 4\nCounter: aten::_local_scalar_dense\n  Value: 4\n"
        "Counter: mylib::op\n  Value: 4\nCounter: xla::add\n  Value: 8\n"
    )
    found = {
        (name, tuple(sorted(dict(labels).items()))): v
        for (name, labels), v in samples(ok("parse", str(report))).items()
    }
    rank = (("local_rank", "0"),)
    assert found[("xla_cpu_fallback_ops_total", rank + (("op", "mylib::op"), ("rank", "0")))] == 4
    assert found[("xla_lowered_ops_total", rank + (("op", "xla::add"), ("rank", "0")))] == 8
    assert found[("xla_host_scalar_reads_total", rank + (("rank", "0"),))] == 4
    assert [key for key in found if key[0] == "xla_cpu_fallback_ops_total"] == [
        ("xla_cpu_fallback_ops_total", rank + (("op", "mylib::op"), ("rank", "0")))
    ]


@pytest.mark.parametrize("report", REPORTS, ids=lambda path: path.name)
def test_parse_output_passes_promtool(report):
    promtool = shutil.which("promtool")
    assert promtool, "promtool is needed (make test installs Prometheus)"
    exposition = ok("parse", str(report))
    check = subprocess.run([promtool, "check", "metrics"], input=exposition, capture_output=True, text=True, timeout=60)
    assert (check.returncode, check.stdout, check.stderr) == (0, "", "")


def test_parse_json_holds_the_same_values():
    document = json.loads(ok("parse", "--format", "json", str(FIXTURES / "mix.report.txt")))
    expected = truth("mix")
    assert document["step"] is None
    assert document["counters"] == expected["counters"]
    assert set(document["metrics"]) == set(expected["metrics"])
    compile_time = document["metrics"]["CompileTime"]
    assert compile_time["unit"] == "seconds"
    assert compile_time["total_samples"] == expected["metrics"]["CompileTime"][0]
    assert compile_time["accumulator"] == pytest.approx(expected["metrics"]["CompileTime"][1] / 1e9, abs=1e-9)
    assert set(compile_time["percentiles"]) == {"0.01", "0.05", "0.1", "0.2", "0.5", "0.8", "0.9", "0.95", "0.99"}
    assert document["metrics"]["OutboundData"]["unit"] == "bytes"
    assert document["metrics"]["TensorsGraphSize"]["unit"] == "number"


def test_parse_reads_the_last_report_of_a_dump():
    document = json.loads(ok("parse", "--format", "json", str(FIXTURES / "metrics_file.fallback.txt")))
    assert document["step"] == 2
    assert document["counters"]["MarkStep"] == 3


def test_parse_nan_is_null_in_json():
    document = json.loads(ok("parse", "--format", "json", str(FIXTURES / "old_xrt.report.txt")))
    assert document["metrics"]["XrtAllocateFromTensor_Bytes"]["accumulator"] == 8192.0


def test_parse_reads_standard_input():
    text = (FIXTURES / "plain.report.txt").read_text()
    assert ok("parse", "-", stdin=text) == ok("parse", str(FIXTURES / "plain.report.txt"))


# ----- explain


def fallback_table(text: str) -> list[tuple[str, int]]:
    return [(name, int(count)) for name, count in re.findall(r"^\s+(\w+::\S+)\s+(\d+)\s+\(", text, re.MULTILINE)]


def test_explain_names_the_fallback_operators_by_count():
    text = ok("explain", str(FIXTURES / "fallback.report.txt"))
    counters = truth("fallback")["counters"]
    table = fallback_table(text)
    assert {name for name, _ in table} == {"aten::digamma", "aten::lgamma"}
    assert table == sorted(table, key=lambda row: (-row[1], row[0]))
    assert all(count == counters[name] for name, count in table)
    assert "1. CPU fallback: 2 operators without an XLA lowering ran on the CPU" in text
    assert "neuron_parallel_compile --command analyze" in text
    graphs = counters["CachedCompile"] + counters["UncachedCompile"]
    assert f"Graph fragmentation: {graphs / counters['MarkStep']:.1f} graphs per step" in text


def test_explain_says_a_clean_report_is_clean():
    text = ok("explain", str(FIXTURES / "plain.report.txt"))
    assert "Nothing wrong found" in text
    assert "Findings" not in text and "What to do next" not in text


def test_explain_item_is_a_host_read_not_a_fallback():
    text = ok("explain", str(FIXTURES / "item.report.txt"))
    steps = truth("item")["steps"]
    assert fallback_table(text) == []
    assert "CPU fallback:" not in text
    assert f"1. Host reads: the host read device values {steps} times (1.0 per step marker)" in text
    assert f"Of the {steps} device-to-host transfers, {steps} are .item() calls (aten::_local_scalar_dense;" in text
    assert "xm.add_step_closure()" in text
    assert "Graph fragmentation: 2.0 graphs per step" in text


def test_explain_torchvision_operators_are_cpu_fallbacks():
    text = ok("explain", str(FIXTURES / "torchvision.report.txt"))
    counters = truth("torchvision")["counters"]
    ran_on_cpu = truth("torchvision")["executed_fallback_ops"]
    assert dict(fallback_table(text)) == {name: counters[name] for name in ran_on_cpu}
    assert "1. CPU fallback: 3 operators without an XLA lowering ran on the CPU" in text
    assert "CPU fallback operators:  3 operators, 24 calls" in text
    assert "torch.library" in text and "aten:: operator" not in text  # no aten:: operator to ask a lowering for
    assert "..._backward runs when the gradient of its forward operator is computed" in text
    assert "Graph fragmentation: 4.0 graphs per step marker (32 graphs in 8 step markers)" in text
    assert "Host reads:" not in text  # every transfer is a copy made by a fallback operator


def test_explain_changing_shapes_are_compilations_after_the_first_steps():
    text = ok("explain", str(FIXTURES / "dynshape.report.txt"))
    steps = truth("dynshape")["steps"]
    assert f"1. Compilations after the first steps: {steps - 1} ({steps} compilations in {steps} step markers)" in text
    titles = re.findall(r"^\d+\. (.+)$", text, re.MULTILINE)
    assert not [title for title in titles if "ecompil" in title]  # a report cannot tell them from new graphs
    assert "cannot say why a graph was compiled" in text and "a new graph" in text
    assert "For shapes that change: pad inputs" in text and "For new graphs:" in text
    assert "Graph fragmentation" not in text and "CPU fallback:" not in text


def test_explain_mix():
    text = ok("explain", str(FIXTURES / "mix.report.txt"))
    titles = re.findall(r"^\d+\. (.+)$", text, re.MULTILINE)
    # 2 .item() calls in 8 steps are too few for a finding of their own; they cut graphs, which is one
    expected = ["CPU fallback:", "Graph fragmentation:", "Compilations after the first steps:"]
    assert len(titles) == len(expected)
    assert all(title.startswith(start) for title, start in zip(titles, expected, strict=False)), titles
    assert "The report has the CPU fallback operators above and .item() calls" in text


def test_explain_the_last_report_of_a_dump():
    text = ok("explain", str(FIXTURES / "metrics_file.fallback.txt"))
    assert text.startswith(f"Report: {FIXTURES / 'metrics_file.fallback.txt'} (the last of 3 reports, step 2)\n")
    assert fallback_table(text) == [("aten::digamma", 3), ("aten::lgamma", 3)]
    assert "markers that ran graphs: 3 (syncs that ran a graph, from the dump; see Steps)" in text


def test_explain_counts_the_steps_of_a_dump_by_its_reports():
    """4 steps under torch_xla.step(), each with an .item(): 8 syncs, 8 graphs; the dump tells which syncs ran one."""
    text = ok("explain", str(FIXTURES / "metrics_file.step_item.txt"))
    assert "markers that ran graphs: 4 (syncs that ran a graph, from the dump; see Steps)" in text
    assert "Graph fragmentation: 2.0 graphs per step marker (8 graphs in 4 step markers)" in text


# ----- errors: one line, exit code 2


@pytest.mark.parametrize("command", ["parse", "explain"])
def test_missing_file(command, tmp_path):
    missing = tmp_path / "nope.txt"
    assert fails(command, str(missing)) == f"neuron-exporter: error: {missing}: no such file\n"


@pytest.mark.parametrize("command", ["parse", "explain"])
def test_unreadable_files(command, tmp_path):
    assert fails(command, str(tmp_path)) == f"neuron-exporter: error: {tmp_path}: is a directory, not a report file\n"
    binary = tmp_path / "report.bin"
    binary.write_bytes(b"Metric: x\n\xff\xfe")
    assert (
        fails(command, str(binary)) == f"neuron-exporter: error: {binary}: not a text report (byte 10 is not UTF-8)\n"
    )


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_file_without_read_permission(tmp_path):
    report = tmp_path / "report.txt"
    report.write_text((FIXTURES / "plain.report.txt").read_text())
    report.chmod(0)
    assert fails("parse", str(report)) == f"neuron-exporter: error: {report}: cannot read the file: permission denied\n"


@pytest.mark.parametrize("command", ["parse", "explain"])
def test_malformed_report(command, tmp_path):
    lines = (FIXTURES / "plain.report.txt").read_text().splitlines(keepends=True)
    report = tmp_path / "report.txt"
    report.write_text("".join(lines[:3]))  # Metric, TotalSamples, Accumulator: cut before the Percentiles
    name = lines[0].split(": ")[1].strip()
    assert fails(command, str(report)) == (
        f'neuron-exporter: error: {report}:1: Metric block "{name}" is truncated: '
        f'the text ends before "  Percentiles: <p>%=<value>; ..."\n'
    )


def test_empty_report(tmp_path):
    report = tmp_path / "empty.txt"
    report.write_text("")
    assert fails("explain", str(report)) == (
        f"neuron-exporter: error: {report}:1: no report here: the text has no "
        f'"Metric: <name>" or "Counter: <name>" block\n'
    )


def test_bad_rank():
    result = neuron_exporter("parse", "--rank", "first", str(FIXTURES / "plain.report.txt"))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert (
        result.stderr.splitlines()[-1]
        == 'neuron-exporter parse: error: argument --rank: "first" is not a rank (a whole number such as 0)'
    )


@pytest.mark.parametrize(
    "command, words",
    [
        ("parse", ["REPORT", "--format {prometheus,json}", "--rank", "XLA_METRICS_FILE", "exit status"]),
        ("explain", ["REPORT", "fall back to the CPU", "Nothing wrong found", "XLA_METRICS_FILE", "exit status"]),
    ],
)
def test_help(command, words):
    text = ok(command, "--help")
    assert text.startswith(f"usage: neuron-exporter {command} ")
    for word in words:
        assert word in text


def test_explain_gives_per_marker_figures_unless_told_the_training_steps():
    """A report cannot see optimizer steps: without --steps the figures are per step marker that ran a graph, never
    per step; with --steps N they are per training step."""
    report = str(FIXTURES / "step_item.report.txt")
    text = ok("explain", report)
    assert "training steps:          unknown: a report does not count optimizer steps" in text
    assert "per step)" not in text and "graphs per step marker (16 graphs in 8 step markers)" in text
    text = ok("explain", "--steps", "4", report)
    assert "training steps:          4, as given with --steps" in text
    assert "Graph fragmentation: 4.0 graphs per step (16 graphs in 4 steps)" in text
    assert "(2.0 per step)" in text  # the 8 host reads
    result = neuron_exporter("explain", "--steps", "0", report)
    assert result.returncode == 2 and '"0" is not a step count' in result.stderr
