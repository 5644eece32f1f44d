"""``neuron-exporter parse`` and ``neuron-exporter explain``, run as a user runs them, on captured reports."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, samples, value, xla_env

FIXTURES = Path(__file__).parent / "fixtures" / "reports"
REPORTS = sorted(FIXTURES.glob("*.report.txt")) + sorted(FIXTURES.glob("*.short.txt")) + \
    [FIXTURES / "metrics_file.fallback.txt"]


def neuron_exporter(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "neuron_exporter", *args], input=stdin, capture_output=True,
                          text=True, env=xla_env(), cwd=ROOT, timeout=120)


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
    assert value(exposition, "xla_compile_seconds_total", **rank) == pytest.approx(metrics["CompileTime"][1] / 1e9,
                                                                                   abs=1e-9)
    assert value(exposition, "xla_host_scalar_reads_total", **rank) == 0
    assert all(dict(labels).get("rank") == "3" for _, labels in samples(exposition))


def test_parse_counts_item_as_a_host_read_never_as_a_fallback():
    exposition = ok("parse", str(FIXTURES / "item.report.txt"))
    assert value(exposition, "xla_host_scalar_reads_total", rank="0", local_rank="0") == \
        truth("item")["counters"]["aten::_local_scalar_dense"]
    assert "aten::_local_scalar_dense" not in exposition.split("xla_host_scalar_reads_total")[-1]
    assert not [key for key in samples(exposition) if key[0] == "xla_cpu_fallback_ops_total"]


@pytest.mark.parametrize("report", REPORTS, ids=lambda path: path.name)
def test_parse_output_passes_promtool(report):
    promtool = shutil.which("promtool")
    assert promtool, "promtool is needed (make test installs Prometheus)"
    exposition = ok("parse", str(report))
    check = subprocess.run([promtool, "check", "metrics"], input=exposition, capture_output=True, text=True,
                           timeout=60)
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
    return [(name, int(count)) for name, count in re.findall(r"^\s+(aten::\S+)\s+(\d+)\s+\(", text, re.MULTILINE)]


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
    assert "Host reads inside the step" in text
    assert f"{steps} of them are .item() calls (aten::_local_scalar_dense: 1.0 per step)" in text
    assert "xm.add_step_closure()" in text
    assert "Graph fragmentation: 2.0 graphs per step" in text


def test_explain_changing_shapes_are_recompiles():
    text = ok("explain", str(FIXTURES / "dynshape.report.txt"))
    steps = truth("dynshape")["steps"]
    assert f"1. Recompilation: {steps} compilations for {steps} steps (1.0 per step)" in text
    assert "bucket sizes" in text
    assert "Graph fragmentation" not in text and "CPU fallback:" not in text


def test_explain_mix_finds_everything():
    text = ok("explain", str(FIXTURES / "mix.report.txt"))
    titles = re.findall(r"^\d+\. (.+)$", text, re.MULTILINE)
    expected = ["CPU fallback:", "Host reads inside the step", "Graph fragmentation:", "Recompilation:"]
    assert len(titles) == len(expected)
    assert all(title.startswith(start) for title, start in zip(titles, expected)), titles


def test_explain_the_last_report_of_a_dump():
    text = ok("explain", str(FIXTURES / "metrics_file.fallback.txt"))
    assert text.startswith(f"Report: {FIXTURES / 'metrics_file.fallback.txt'} (the last of 3 reports, step 2)\n")
    assert fallback_table(text) == [("aten::digamma", 3), ("aten::lgamma", 3)]


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
    assert fails(command, str(binary)) == f"neuron-exporter: error: {binary}: not a text report (byte 10 is not UTF-8)\n"


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
    assert fails(command, str(report)) == (f'neuron-exporter: error: {report}:1: Metric block "{name}" is truncated: '
                                           f'the text ends before "  Percentiles: <p>%=<value>; ..."\n')


def test_empty_report(tmp_path):
    report = tmp_path / "empty.txt"
    report.write_text("")
    assert fails("explain", str(report)) == (f'neuron-exporter: error: {report}:1: no report here: the text has no '
                                             f'"Metric: <name>" or "Counter: <name>" block\n')


def test_bad_rank():
    result = neuron_exporter("parse", "--rank", "first", str(FIXTURES / "plain.report.txt"))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.splitlines()[-1] == \
        'neuron-exporter parse: error: argument --rank: "first" is not a rank (a whole number such as 0)'


@pytest.mark.parametrize("command, words", [
    ("parse", ["REPORT", "--format {prometheus,json}", "--rank", "XLA_METRICS_FILE", "exit status"]),
    ("explain", ["REPORT", "fall back to the CPU", "Nothing wrong found", "XLA_METRICS_FILE", "exit status"]),
])
def test_help(command, words):
    text = ok(command, "--help")
    assert text.startswith(f"usage: neuron-exporter {command} ")
    for word in words:
        assert word in text
