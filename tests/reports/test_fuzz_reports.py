"""Fuzz: mutations of every captured report, fed to the parser and to ``parse`` and ``explain``.

The parser raises nothing but ReportParseError, whose message is one short printable line naming the source and
line; what it accepts exports only finite counters of at least 0. The commands answer every input with exit code 0,
or 2 and one line: never a traceback, never the last-resort "internal error".
"""

from __future__ import annotations

import io
import json
import math
import os
import subprocess
import sys

import pytest
from prometheus_client.parser import text_string_to_metric_families

from neuron_exporter.cli import main
from neuron_exporter.reports.report_parser import LARGEST_COUNT, ReportParseError, parse_report_stream
from neuron_exporter.snapshot_metrics import snapshot_families
from tests.support.fuzz import FUZZ_CASES, cases
from tests.support.paths import FIXTURES as TEST_FIXTURES
from tests.support.paths import ROOT

FIXTURES = TEST_FIXTURES / "reports"
REPORTS = sorted(FIXTURES.glob("*.txt"))
SEEDS = [path.read_bytes() for path in REPORTS]
LONGEST_ERROR = 400  # characters
CLI_CASES = FUZZ_CASES  # per command, in process
SUBPROCESS_CASES = max(5, FUZZ_CASES // 60)  # per command, each a new interpreter


def check_error_line(line: str, source: str, case: str) -> None:
    assert line.isprintable() and len(line) <= LONGEST_ERROR, (case, line[:1000])
    assert line.startswith(f"{source}:"), (case, line)


def check_exported(snapshot, case: str) -> None:
    for name, value in snapshot.counters.items():
        assert isinstance(value, int) and 0 <= value <= LARGEST_COUNT, (case, name, value)
    for family in snapshot_families(snapshot, {"rank": "0"}):
        for sample in family.samples:
            assert math.isfinite(sample.value) and math.copysign(1.0, sample.value) > 0, (case, sample)


@pytest.mark.parametrize("report", REPORTS, ids=lambda path: path.name)
def test_fuzz_parser(report):
    parsed = 0
    for case, data in cases([report.read_bytes()], f"parser:{report.name}"):
        text = data.decode("utf-8", "surrogateescape")  # bytes that are not UTF-8 become lone surrogates
        try:
            for _, snapshot in parse_report_stream(text, "report.txt"):
                check_exported(snapshot, case)
            parsed += 1
        except ReportParseError as error:
            check_error_line(str(error), "report.txt", case)
        except Exception as error:  # noqa: BLE001 - any other: fail naming the case, to reproduce it
            pytest.fail(f"case {case}: {error!r:.500}")
    assert parsed > 0  # some mutations keep a valid report: the checks above ran


def run_in_process(capsys, monkeypatch, args: list[str], stdin: bytes | None = None) -> tuple[int, str, str]:
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("command", ["parse", "explain"])
def test_fuzz_commands_in_process(command, tmp_path, capsys, monkeypatch):
    path = tmp_path / "report.txt"
    exits = {0: 0, 2: 0}
    for index, (case, data) in enumerate(cases(SEEDS, f"cli:{command}", CLI_CASES)):
        json_output = command == "parse" and index % 3 == 2
        args = [command, "-" if index % 2 else str(path)] + (["--format", "json"] if json_output else [])
        if index % 2 == 0:
            path.write_bytes(data)
        code, out, err = run_in_process(capsys, monkeypatch, args, data if index % 2 else None)
        assert code in exits, (case, code, err[:1000])
        exits[code] += 1
        if code == 2:
            assert out == "" and err.endswith("\n") and err.count("\n") == 1, (case, err[:1000])
            assert err.startswith("neuron-exporter: error: "), (case, err)
            check_error_line(err[len("neuron-exporter: error: ") : -1], "<stdin>" if index % 2 else str(path), case)
        elif json_output:
            assert err == "" and json.loads(out)["counters"] is not None, case
        elif command == "parse":
            assert err == "", case
            for family in text_string_to_metric_families(out):
                assert all(math.isfinite(s.value) and s.value >= 0 for s in family.samples), (case, family)
        else:
            assert err == "" and out.startswith("Report: "), case
    assert exits[0] > 0 and exits[2] > 0, exits


@pytest.mark.parametrize("command", ["parse", "explain"])
def test_fuzz_commands_print_no_traceback(command, tmp_path):
    """A few real runs: what reaches the terminal, after the interpreter's own start and exit."""
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT)}
    for index, (case, data) in enumerate(cases(SEEDS, f"subprocess:{command}", SUBPROCESS_CASES)):
        path = tmp_path / f"report-{index}.txt"
        path.write_bytes(data)
        result = subprocess.run(
            [sys.executable, "-m", "neuron_exporter", command, str(path)],
            capture_output=True,
            cwd=ROOT,
            env=env,
            timeout=60,
        )
        stderr = result.stderr.decode(errors="replace")
        assert result.returncode in (0, 2) and "Traceback" not in stderr, (case, stderr[-2000:])
        assert stderr == "" if result.returncode == 0 else stderr.count("\n") == 1, (case, stderr[-2000:])
