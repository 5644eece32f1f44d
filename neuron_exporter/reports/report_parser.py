"""Read the text of torch_xla's ``metrics_report()`` back into a Snapshot.

For saved reports, ``XLA_METRICS_FILE`` dumps, and builds where only the text is available. The layout
(torch_xla/csrc/runtime/metrics.cpp, the same in the torch::lazy arena):

    Metric: CompileTime
      TotalSamples: 2
      Accumulator: 390ms043.556us
      ValueRate: 01s098ms069.970us / second      (optional, with Rate)
      Rate: 7.91562 / second
      Percentiles: 1%=061ms308.992us; 5%=061ms308.992us; ...
    Counter: MarkStep
      Value: 8

Older reports are read too: ``Mean:`` / ``StdDev:`` lines, any percentile list (``25%=``), ``nan`` values,
and ``Counter:`` in place of ``Accumulator:`` inside a Metric block. A value's form gives the metric's
unit: durations (``...us``) are seconds, sizes (``B``, ``KB``, ... 1024-based) are bytes, the rest plain
numbers. Anything else is a ``ReportParseError`` naming the line.

What a report can hold: torch_xla records times, sizes and counts of things (graph sizes, aliased buffers),
never a negative one, and the captured reports in tests/fixtures/reports hold none. Counters and each metric's
total samples and accumulator are exported as Prometheus counters, so they must be whole (counts) or finite
(accumulators) and at least 0; a value larger than 2^64 (seconds, bytes or things) is no real report either.
``nan`` is kept where old reports print it (a ``StdDev`` with too few samples, percentiles), never in an
accumulator.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass

from ..snapshot import BYTES, NUMBER, SECONDS, MetricValue, Snapshot
from ..untrusted import printable, quoted

STREAM_HEADER = re.compile(r"\[MetricsData; step=(\d{1,19})\]", re.ASCII)

# Duration fields, largest first: (suffix, seconds per unit, range within the next larger unit).
DURATION_FIELDS = (
    ("d", 86400.0, None),
    ("h", 3600.0, 24),
    ("m", 60.0, 60),
    ("s", 1.0, 60),
    ("ms", 1e-3, 1000),
    ("us", 1e-6, 1000),
)
# Values are printed with fixed decimals (3 for microseconds, 2 otherwise); holding to that catches a
# value cut in the middle, as in a truncated file.
DURATION = re.compile(r"(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?(?:(\d+)ms)?(\d+\.\d{3}|0*nan)us", re.ASCII)
BYTE_SUFFIXES = {"B": 0, "KB": 1, "MB": 2, "GB": 3, "TB": 4, "PB": 5}
_TWO_DECIMALS = r"-?\d+\.\d\d|-?nan|-?inf"
BYTE_SIZE = re.compile(rf"({_TWO_DECIMALS})(B|KB|MB|GB|TB|PB)", re.ASCII)
NUMBER_VALUE = re.compile(_TWO_DECIMALS, re.ASCII)
NUMBER_TEXT = re.compile(r"-?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|-?nan|-?inf", re.ASCII)  # Rate, percent
INTEGER = re.compile(r"-?\d+", re.ASCII)
LARGEST_COUNT = 2**64 - 1  # torch_xla's counters and sample counts are 64-bit integers
LARGEST_VALUE = 2.0**64
PER_SECOND = re.compile(r"(\S+) / second")

TOTAL_SAMPLES_FORM = '"  TotalSamples: <int>"'
ACCUMULATOR_FORM = '"  Accumulator: <value>"'
PERCENTILES_FORM = '"  Percentiles: <p>%=<value>; ..."'
VALUE_FORM = '"  Value: <int>"'
BLOCK_FORM = '"Metric: <name>" or "Counter: <name>"'


class ReportParseError(ValueError):
    """A report that cannot be read; ``str()`` is one line: ``source:line: what is wrong``."""

    def __init__(self, source: str, line: int, problem: str):
        source = printable(source)
        super().__init__(f"{source}:{line}: {problem}")
        self.source = source
        self.line = line
        self.problem = problem


def parse_duration(text: str) -> float:
    """Seconds from a torch_xla duration such as ``09s969ms486.408us`` or ``000.410us``.

    torch_xla prints every field but the last rounded to an integer and then takes away the floor of
    the unrounded field, so a field reads one too high whenever the rest below it is at least half of
    it (``045ms763.787us`` means 44.763787 ms). Working up from the microseconds undoes that.
    """
    match = DURATION.fullmatch(text)
    if not match:
        raise ValueError(f"{quoted(text)} is not a duration like 09s969ms486.408us")
    if match.group(6).endswith("nan"):
        if any(match.groups()[:5]):
            raise ValueError(f"{quoted(text)} is not a duration like 09s969ms486.408us")
        return math.nan
    present = [i for i, field in enumerate(match.groups()) if field is not None]
    if present != list(range(present[0], len(DURATION_FIELDS))):
        raise ValueError(f"{quoted(text)} skips a unit: torch_xla prints every unit below the first one")
    values = [float(field) if field is not None else 0.0 for field in match.groups()]
    first = present[0]
    for i in range(len(DURATION_FIELDS) - 2, first - 1, -1):
        # The first field is printed only when it is at least 1, so a 1 there was never rounded up;
        # neither was a 0 further down. Either means the text came from a formatter without the quirk.
        below = DURATION_FIELDS[i + 1][2]  # how many of the unit below make one of this
        assert below is not None  # only the first unit, days, has none above it
        if values[i + 1] >= below / 2 and values[i] >= (2 if i == first else 1):
            values[i] -= 1
    return sum(value * scale for value, (_, scale, _) in zip(values, DURATION_FIELDS, strict=True))


def parse_bytes(text: str) -> float:
    """Bytes from a torch_xla size such as ``40.00B``, ``8.00KB`` or ``1.65MB`` (1024-based)."""
    match = BYTE_SIZE.fullmatch(text)
    if not match:
        raise ValueError(f"{quoted(text)} is not a size like 450.04KB")
    return float(match.group(1)) * 1024.0 ** BYTE_SUFFIXES[match.group(2)]


def parse_value(text: str) -> tuple[float, str]:
    """A report value in base units, with its unit (``SECONDS``, ``BYTES`` or ``NUMBER``)."""
    if text.endswith("us"):
        return parse_duration(text), SECONDS
    if text.endswith("B"):
        return parse_bytes(text), BYTES
    if NUMBER_VALUE.fullmatch(text):
        return float(text), NUMBER
    raise ValueError(f"{quoted(text)} is not a duration (09s969ms486.408us), a size (8.00KB) or a number (4.00)")


@dataclass(frozen=True)
class _Block:
    """The header of the block being read."""

    kind: str  # "Metric" or "Counter"
    name: str
    line: int
    indent: int


class _Reader:
    """Reads the reports of a text, line by line, into Snapshots."""

    def __init__(self, text: str, source: str):
        # Lines end at \n, \r\n or \r only, so the numbers in errors are those an editor shows.
        self.lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
        if self.lines[-1] == "":
            self.lines.pop()
        self.source = source
        self.next = 0  # index of the next line to read
        self.cut_short = bool(text) and not text.endswith(("\n", "\r"))  # torch_xla ends every line

    def error(self, line: int, problem: str) -> ReportParseError:
        return ReportParseError(self.source, line, problem)

    def reports(self) -> Iterator[tuple[int | None, int, Snapshot]]:
        """Yield (step, first line, Snapshot) for each report; step is None without a stream header."""
        step: int | None = None
        start = 1
        found = False
        while True:
            snapshot = Snapshot()
            blocks = self.blocks(snapshot)
            found = found or blocks > 0
            if blocks or step is not None:
                yield step, start, snapshot
            if self.next == len(self.lines):
                break
            start = self.next + 1
            header = STREAM_HEADER.fullmatch(self.lines[self.next].strip())
            assert header is not None  # blocks() stops at a stream header or at the end
            step = int(header.group(1))
            self.next += 1
        if not found:
            raise self.error(1, f"no report here: the text has no {BLOCK_FORM} block")

    def blocks(self, into: Snapshot) -> int:
        """Read blocks up to the next stream header or the end of the text; return how many.

        A name that appears twice keeps its first value, as torch_xla's own lookups do (they search
        the torch::lazy arena before the runtime arena).
        """
        count = 0
        metrics: list[tuple[_Block, MetricValue]] = []
        last_kind = None
        while self.next < len(self.lines):
            line = self.lines[self.next]
            stripped = line.strip()
            if STREAM_HEADER.fullmatch(stripped):
                break
            self.next += 1
            if not stripped:
                continue
            kind, _, name = stripped.partition(": ")
            block = _Block(kind, name.strip(), self.next, _indent(line))
            if kind in ("Metric", "Counter") and not block.name.isprintable():
                raise self.error(self.next, f"bad {kind} name {quoted(block.name)}: it has a non-printable character")
            if kind == "Metric" and block.name:
                metrics.append((block, self.metric(block)))
                into.metrics.setdefault(block.name, metrics[-1][1])
            elif kind == "Counter" and block.name:
                _, text, line_number = self.field(block, VALUE_FORM, "Value")
                value = self.integer(text, line_number, f"Value of counter {quoted(block.name)}")
                into.counters.setdefault(block.name, value)
            else:
                raise self.error(self.next, f"unknown line {quoted(line)} (expected {BLOCK_FORM})")
            count += 1
            last_kind = kind
        if self.cut_short and self.next == len(self.lines) and last_kind == "Metric" and len(metrics) >= 2:
            self.check_last_percentiles(*metrics[-2:])
        return count

    def check_last_percentiles(self, previous: tuple[_Block, MetricValue], last: tuple[_Block, MetricValue]) -> None:
        """A text that stops without a final newline may have lost the end of its last Percentiles line.

        Every metric of one report lists the same percentiles (XLA_METRICS_PERCENTILES), so a last line
        with fewer of them than the metric before it was cut.
        """
        (previous_block, previous_metric), (last_block, last_metric) = previous, last
        found, expected = len(last_metric.percentiles), len(previous_metric.percentiles)
        if found < expected:
            raise self.error(
                len(self.lines),
                f"Metric block {quoted(last_block.name)} is truncated: the text stops "
                f"in the middle of its Percentiles line ({found} percentiles where "
                f"{quoted(previous_block.name)} has {expected})",
            )

    def field(self, block: _Block, form: str, *keys: str) -> tuple[str, str, int]:
        """The next line of ``block``, which must be ``<key>: <text>`` for one of ``keys``."""
        if self.next == len(self.lines):
            raise self.error(
                block.line, f"{block.kind} block {quoted(block.name)} is truncated: the text ends before {form}"
            )
        line = self.lines[self.next]
        self.next += 1
        key, sep, text = line.strip().partition(":")
        if not sep or key not in keys or _indent(line) <= block.indent:
            got = quoted(line) if line.strip() else "an empty line"
            raise self.error(self.next, f"expected {form} in {block.kind} block {quoted(block.name)}, got {got}")
        return key, text.strip(), self.next

    def metric(self, block: _Block) -> MetricValue:
        what = f"metric {quoted(block.name)}"
        _, text, line = self.field(block, TOTAL_SAMPLES_FORM, "TotalSamples")
        total_samples = self.integer(text, line, f"TotalSamples of {what}")
        # Very old reports (2019) said "Counter:" where "Accumulator:" is now.
        _, text, line = self.field(block, ACCUMULATOR_FORM, "Accumulator", "Counter")
        accumulator, unit = self.value(text, line, f"Accumulator of {what}", None)
        if math.isnan(accumulator):
            raise self.error(line, f"bad Accumulator of {what}: {quoted(text)} is not a number")
        if math.copysign(1.0, accumulator) < 0:
            raise self.error(
                line,
                f"bad Accumulator of {what}: {quoted(text)} is negative, and a sum of times, sizes or counts cannot be",
            )
        optional = ["Mean", "StdDev", "ValueRate", "Rate"]
        while True:
            key, text, line = self.field(block, PERCENTILES_FORM, "Percentiles", *optional)
            if key == "Percentiles":
                return MetricValue(total_samples, accumulator, unit, self.percentiles(text, line, what, unit))
            optional.remove(key)
            if key in ("ValueRate", "Rate"):
                match = PER_SECOND.fullmatch(text)
                if not match:
                    raise self.error(line, f'bad {key} of {what}: expected "<value> / second", got {quoted(text)}')
                text = match.group(1)
            if key != "Rate":
                self.value(text, line, f"{key} of {what}", unit)
            elif not NUMBER_TEXT.fullmatch(text):
                raise self.error(line, f"bad Rate of {what}: {quoted(text)} is not a number")

    def percentiles(self, text: str, line: int, what: str, unit: str) -> dict[float, float]:
        result = {}
        for entry in filter(None, (part.strip() for part in text.split(";"))):
            percent, sep, value_text = entry.partition("%=")
            if not sep or not NUMBER_TEXT.fullmatch(percent):
                raise self.error(line, f'bad percentile of {what}: expected "<p>%=<value>", got {quoted(entry)}')
            if not 0 <= float(percent) <= 100:
                raise self.error(line, f"bad percentile of {what}: {quoted(percent)}% is not between 0% and 100%")
            value, _ = self.value(value_text, line, f"{float(percent):g}% percentile of {what}", unit)
            result[round(float(percent) / 100.0, 9)] = value
        return result

    def value(self, text: str, line: int, what: str, unit: str | None) -> tuple[float, str]:
        try:
            value, found_unit = parse_value(text)
        except ValueError as error:
            raise self.error(line, f"bad {what}: {error}") from None
        if unit is not None and found_unit != unit:
            raise self.error(line, f"bad {what}: {quoted(text)} is in {found_unit} but the metric is in {unit}")
        if abs(value) > LARGEST_VALUE:  # nan passes: see the module's docstring
            raise self.error(line, f"bad {what}: {quoted(text)} is too large (more than 2^64 {found_unit})")
        return value, found_unit

    def integer(self, text: str, line: int, what: str) -> int:
        if not INTEGER.fullmatch(text):
            raise self.error(line, f"bad {what}: {quoted(text)} is not a whole number")
        if text.startswith("-"):
            raise self.error(line, f"bad {what}: {quoted(text)} is negative, and a count cannot be")
        digits = text.lstrip("0") or "0"
        # The length is checked first: int() refuses texts of more than 4300 digits.
        if len(digits) > len(str(LARGEST_COUNT)) or int(digits) > LARGEST_COUNT:
            raise self.error(line, f"bad {what}: {quoted(text)} is too large for a 64-bit count")
        return int(digits)


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def parse_report_stream(text: str, source: str = "<report>") -> Iterator[tuple[int | None, Snapshot]]:
    """Yield ``(step, Snapshot)`` for every report of a text, in order.

    An ``XLA_METRICS_FILE`` dump holds one report per step, each after a ``[MetricsData; step=N]``
    line; a plain ``metrics_report()`` text is one report with step ``None``. Raises ReportParseError
    at the first line that does not belong in a report, or when the text holds no block at all.
    """
    for step, _, snapshot in _Reader(text, source).reports():
        yield step, snapshot


def parse_report(text: str, source: str = "<report>") -> Snapshot:
    """The Snapshot of one ``metrics_report()`` (or ``short_metrics_report()``) text.

    A ``[MetricsData; step=N]`` line before it is allowed; a second report is an error (read a
    multi-report ``XLA_METRICS_FILE`` dump with ``parse_report_stream``). The commands read through
    ``parse_report_stream``; this is for the tests and for scripts that read one saved report.
    """
    reports = _Reader(text, source).reports()
    _, _, snapshot = next(reports)
    for _, line, _ in reports:
        raise ReportParseError(
            source,
            line,
            "a second report starts here; a multi-report XLA_METRICS_FILE dump is read with parse_report_stream",
        )
    return snapshot
