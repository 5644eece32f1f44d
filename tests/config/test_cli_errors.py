"""``parse`` and ``explain`` on inputs that are not report files: one line naming the input, exit code 2, never a
traceback and never a wait without end."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from neuron_exporter.cli import main
from neuron_exporter.reports import report_commands
from neuron_exporter.reports.report_commands import MAX_REPORT_BYTES
from tests.support.paths import FIXTURES as TEST_FIXTURES
from tests.support.paths import ROOT

FIXTURES = TEST_FIXTURES / "reports"
REPORT = FIXTURES / "plain.report.txt"
NO_REPORT = 'no report here: the text has no "Metric: <name>" or "Counter: <name>" block'


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def error_of(capsys, *args: str) -> str:
    """The one line a failing command prints, without its ``neuron-exporter: error: `` prefix."""
    code, out, err = run(capsys, *args)
    assert (code, out) == (2, "")
    assert err.startswith("neuron-exporter: error: ") and err.endswith("\n") and err.count("\n") == 1, err
    return err[len("neuron-exporter: error: ") : -1]


def command_line(*args: str, stdin=None, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "neuron_exporter", *args],
        stdin=stdin,
        capture_output=True,
        cwd=ROOT,
        env={"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT)},
        timeout=timeout,
    )


def one_line_error(result: subprocess.CompletedProcess) -> str:
    stderr = result.stderr.decode()
    assert (result.returncode, result.stdout) == (2, b""), stderr
    assert "Traceback" not in stderr and stderr.count("\n") == 1, stderr
    return stderr


@pytest.mark.parametrize("command", ["parse", "explain"])
def test_a_nul_byte_is_a_binary_file(capsys, tmp_path, command):
    binary = tmp_path / "report.bin"
    binary.write_bytes(REPORT.read_bytes()[:40] + b"\0\1\2")
    assert error_of(capsys, command, str(binary)) == f"{binary}: not a text report (byte 40 is a NUL byte)"


@pytest.mark.parametrize("data", [b"\xff\xfeM\0e\0", "Metric: é".encode("latin-1"), "Metric:".encode("utf-16")])
def test_other_encodings(capsys, tmp_path, data):
    report = tmp_path / "report.txt"
    report.write_bytes(data)
    assert error_of(capsys, "parse", str(report)).startswith(f"{report}: not a text report (byte ")


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/null"])
def test_a_device_is_not_read(capsys, device):
    assert error_of(capsys, "explain", device) == (
        f"{device}: not a regular file (a device or a socket); give a report file, or - to read standard input"
    )


def test_a_file_larger_than_64_mib(capsys, tmp_path):
    huge = tmp_path / "huge.txt"
    with open(huge, "wb") as file:
        file.truncate(MAX_REPORT_BYTES + 1)  # sparse: no disk space used
    assert error_of(capsys, "parse", str(huge)).startswith(f"{huge}: larger than 64 MiB, too large for a report")


def test_a_file_of_64_mib_is_read(capsys, tmp_path):
    text = REPORT.read_bytes()
    report = tmp_path / "padded.txt"
    report.write_bytes(text[:-1] + b" " * (MAX_REPORT_BYTES - len(text)) + b"\n")  # the last line padded
    code, out, _ = run(capsys, "parse", str(report))
    assert code == 0 and "xla_compilations_total" in out


def test_a_file_name_with_control_characters_is_escaped(capsys, tmp_path):
    name = tmp_path / "re\x1b[2Jport\n.txt"
    assert error_of(capsys, "parse", str(name)) == f"{tmp_path}/re\\x1b[2Jport\\n.txt: no such file"


def test_a_fifo_without_a_writer_does_not_wait(tmp_path):
    fifo = tmp_path / "report.fifo"
    os.mkfifo(fifo)
    stderr = one_line_error(command_line("parse", str(fifo), timeout=30))
    assert stderr == f"neuron-exporter: error: {fifo}:1: {NO_REPORT}\n"


def test_a_pipe_is_read():
    """``parse <(command)``: the shell passes a pipe as /dev/fd/N."""
    result = subprocess.run(
        ["bash", "-c", '"$0" -m neuron_exporter explain <(cat "$1")', sys.executable, str(REPORT)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=30,
        env={"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT)},
    )
    assert (result.returncode, result.stderr) == (0, "")
    assert "Nothing wrong found" in result.stdout


def test_endless_standard_input_stops_at_64_mib():
    with open("/dev/zero", "rb") as zeros:
        stderr = one_line_error(command_line("parse", "-", stdin=zeros, timeout=60))
    assert stderr.startswith("neuron-exporter: error: <stdin>: larger than 64 MiB, too large for a report")


def test_closed_standard_input():
    result = subprocess.run(
        ["sh", "-c", 'exec "$0" -m neuron_exporter parse - <&-', sys.executable],
        capture_output=True,
        cwd=ROOT,
        timeout=30,
        env={"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT)},
    )
    stderr = one_line_error(result)
    assert stderr == "neuron-exporter: error: <stdin>: cannot read the file: standard input is closed\n"


def test_a_reader_that_goes_away_is_no_error():
    """``neuron-exporter parse report | head -1``: the pipe closes before the output is written."""
    process = subprocess.Popen(
        [sys.executable, "-m", "neuron_exporter", "parse", str(FIXTURES / "mix.report.txt")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        env={"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT)},
    )
    process.stdout.close()
    stderr = process.stderr.read().decode()
    assert process.wait(timeout=30) == 1
    assert stderr == ""


def test_an_unexpected_error_is_one_line(capsys, monkeypatch):
    def broken(snapshot, **options):
        raise RuntimeError("a bug\nwith a second line")

    monkeypatch.setattr(report_commands, "explain", broken)
    code, out, err = run(capsys, "explain", str(REPORT))
    assert (code, out) == (1, "")
    assert err == "neuron-exporter: internal error: RuntimeError('a bug\\nwith a second line'); please report it\n"


def test_interrupted(capsys, monkeypatch):
    def interrupted(path):
        raise KeyboardInterrupt

    monkeypatch.setattr(report_commands, "_read", interrupted)
    assert run(capsys, "parse", str(REPORT)) == (130, "", "")
