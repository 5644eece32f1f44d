"""``neuron-exporter parse`` and ``neuron-exporter explain``: work on a saved ``metrics_report()`` text."""

from __future__ import annotations

import argparse
import json
import math
import os
import stat
import sys

from prometheus_client import CollectorRegistry, generate_latest

from ..snapshot import Snapshot
from ..snapshot_metrics import snapshot_families
from ..untrusted import EXIT_USAGE, printable
from .explain import explain
from .report_parser import ReportParseError, parse_report_stream
from .step_count import SyncHistory

# A full metrics_report() is about 5 KB, so 64 MiB holds an XLA_METRICS_FILE dump of some 10,000 steps. Reading
# stops there, so an endless input (a pipe that never ends, /dev/zero as standard input) ends in an error.
MAX_REPORT_BYTES = 64 * 1024 * 1024

REPORT_HELP = (
    "a saved met.metrics_report() (or short_metrics_report()) text, or an XLA_METRICS_FILE dump, "
    "whose last report is used; - reads standard input"
)
PARSE_DESCRIPTION = """\
Read a saved torch_xla metrics report and print it in the Prometheus text exposition
format, with the metric names attach() serves (xla_compilations_total,
xla_cpu_fallback_ops_total{op="aten::..."}, xla_metric_seconds_total{metric="..."}, ...),
or, with --format json, the counters and metrics in base units (seconds, bytes)."""
EXPLAIN_DESCRIPTION = """\
Read a saved torch_xla metrics report and say in plain language what slows the training
loop down: operators that fall back to the CPU (aten::, torchvision::, custom ops; by
count), host reads such as .item(), steps cut into several graphs, compilations that go
on after the first steps.
Output: an overview of the figures; how the steps were counted (a report counts syncs
and graphs, not training steps: the steps are worked out from them, exactly from an
XLA_METRICS_FILE dump); then each finding with what to do next, or "Nothing wrong found"."""
INPUT_TEXT = """\
input: the text of torch_xla.debug.metrics.metrics_report() or short_metrics_report():
    Metric: CompileTime
      TotalSamples: 2
      Accumulator: 390ms043.556us
      Percentiles: 1%=061ms308.992us; ...
    Counter: aten::lgamma
      Value: 8
or a file written with XLA_METRICS_FILE set (one report per step, each after
"[MetricsData; step=N]"): the last report is used. Older formats (Mean/StdDev lines,
XRT-era metric names) are read too.

exit status: 0; 2 with a one-line error naming the file and line when the report is
missing, unreadable, larger than 64 MiB or malformed."""


class _SnapshotCollector:
    """Exposes one fixed Snapshot."""

    def __init__(self, snapshot: Snapshot, labels: dict[str, str]):
        self.snapshot = snapshot
        self.labels = labels

    def collect(self):
        yield from snapshot_families(self.snapshot, self.labels)

    def describe(self):
        return self.collect()


class CommandError(Exception):
    """A problem with the command's input, reported as one line."""


def _rank(text: str) -> str:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f'"{text}" is not a rank (a whole number such as 0)')
    return str(int(text))


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) == 0:
        raise argparse.ArgumentTypeError(f'"{text}" is not a step count (a whole number above 0)')
    return int(text)


def register(subparsers) -> None:
    parse = subparsers.add_parser(
        "parse",
        help="turn a saved metrics_report() text into Prometheus text (or JSON)",
        description=PARSE_DESCRIPTION,
        epilog=INPUT_TEXT,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parse.add_argument("report", metavar="REPORT", help=REPORT_HELP)
    parse.add_argument(
        "--format",
        choices=("prometheus", "json"),
        default="prometheus",
        help="prometheus: text exposition format, every series labelled rank and local_rank "
        "(default); json: the counters, and each metric's total samples, accumulator in base "
        "units (seconds, bytes), unit and percentiles",
    )
    parse.add_argument("--rank", type=_rank, default="0", help="value of the rank and local_rank labels (default 0)")
    parse.set_defaults(run=run_parse)

    explain_parser = subparsers.add_parser(
        "explain",
        help="diagnose a saved metrics_report() text in plain language",
        description=EXPLAIN_DESCRIPTION,
        epilog=INPUT_TEXT,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    explain_parser.add_argument("report", metavar="REPORT", help=REPORT_HELP)
    explain_parser.add_argument(
        "--steps",
        type=_positive,
        metavar="N",
        help="the training (optimizer) steps the report covers, as you counted them: the "
        "figures are then per training step, not per step marker",
    )
    explain_parser.set_defaults(run=run_explain)


def _read(path: str) -> tuple[str, str]:
    """(text, source name) of a report file, or of standard input for ``-``."""
    source = "<stdin>" if path == "-" else printable(path)
    try:
        data = _read_stdin() if path == "-" else _read_file(path, source)
    except FileNotFoundError:
        raise CommandError(f"{source}: no such file") from None
    except IsADirectoryError:
        raise CommandError(f"{source}: is a directory, not a report file") from None
    except PermissionError:
        raise CommandError(f"{source}: cannot read the file: permission denied") from None
    except OSError as error:
        raise CommandError(f"{source}: cannot read the file: {error.strerror or error}") from None
    if len(data) > MAX_REPORT_BYTES:
        raise CommandError(
            f"{source}: larger than 64 MiB, too large for a report (of a long XLA_METRICS_FILE "
            f"dump, keep the part from its last [MetricsData; step=N] line)"
        )
    nul = data.find(b"\0")
    if nul >= 0:
        raise CommandError(f"{source}: not a text report (byte {nul} is a NUL byte)")
    try:
        return data.decode("utf-8"), source
    except UnicodeDecodeError as error:
        raise CommandError(f"{source}: not a text report (byte {error.start} is not UTF-8)") from None


def _read_stdin() -> bytes:
    if sys.stdin is None:
        raise OSError(0, "standard input is closed")
    return sys.stdin.buffer.read(MAX_REPORT_BYTES + 1)


def _read_file(path: str, source: str) -> bytes:
    """At most MAX_REPORT_BYTES + 1 bytes of a regular file or a pipe; a device or socket is refused."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # opening a FIFO must not wait for a writer
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError
        if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode)):
            raise CommandError(
                f"{source}: not a regular file (a device or a socket); give a report file, or - to read standard input"
            )
        os.set_blocking(fd, True)  # a pipe without a writer then reads as empty
        with os.fdopen(fd, "rb", closefd=False) as file:
            return file.read(MAX_REPORT_BYTES + 1)
    finally:
        os.close(fd)


def _last_report(path: str, history: SyncHistory | None = None) -> tuple[int | None, int, Snapshot, str]:
    """(step, number of reports, Snapshot, source) of the last report in the input; ``history`` follows them all."""
    text, source = _read(path)
    count, step, snapshot = 0, None, None
    for step, snapshot in parse_report_stream(text, source):
        count += 1
        if history is not None:
            history.add(step, snapshot)
    assert snapshot is not None  # parse_report_stream raises on an input without a report
    return step, count, snapshot, source


def _fail(message: str) -> int:
    print(f"neuron-exporter: error: {message}", file=sys.stderr)
    return EXIT_USAGE


def _json_number(value: float) -> float | None:
    return None if math.isnan(value) or math.isinf(value) else value


def snapshot_json(snapshot: Snapshot, step: int | None) -> dict:
    return {
        "step": step,
        "counters": dict(sorted(snapshot.counters.items())),
        "metrics": {
            name: {
                "total_samples": metric.total_samples,
                "accumulator": _json_number(metric.accumulator),
                "unit": metric.unit,
                "percentiles": {str(p): _json_number(v) for p, v in sorted(metric.percentiles.items())},
            }
            for name, metric in sorted(snapshot.metrics.items())
        },
    }


def run_parse(args: argparse.Namespace) -> int:
    try:
        step, _, snapshot, _ = _last_report(args.report)
    except (CommandError, ReportParseError) as error:
        return _fail(str(error))
    if args.format == "json":
        sys.stdout.write(json.dumps(snapshot_json(snapshot, step), indent=2) + "\n")
        return 0
    registry = CollectorRegistry()
    registry.register(_SnapshotCollector(snapshot, {"rank": args.rank, "local_rank": args.rank}))
    sys.stdout.write(generate_latest(registry).decode())
    return 0


def run_explain(args: argparse.Namespace) -> int:
    history = SyncHistory()
    try:
        step, count, snapshot, source = _last_report(args.report, history)
    except (CommandError, ReportParseError) as error:
        return _fail(str(error))
    if count > 1:  # a dump: its reports, one per sync, count the steps better than its last one alone
        text = explain(snapshot, history, args.steps)
        which = f" (the last of {count} reports, step {step})"
    else:
        text, which = explain(snapshot, training_steps=args.steps), ""
    sys.stdout.write(f"Report: {source}{which}\n\n{text}")
    return 0
