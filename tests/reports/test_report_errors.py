"""Reports the parser must refuse, each with one short line naming the file and the line: counts and values no
torch_xla report holds (negative, too large, not a number), and lines that are too long or hold control characters.
"""

from __future__ import annotations

import math

import pytest

from neuron_exporter.reports.report_parser import ReportParseError, parse_report, parse_report_stream
from neuron_exporter.snapshot_metrics import snapshot_families
from tests.support.paths import FIXTURES as TEST_FIXTURES

FIXTURES = TEST_FIXTURES / "reports"
ALL_REPORTS = sorted(FIXTURES.glob("*.txt"))
LONGEST_ERROR = 400  # characters: a problem quotes at most a few texts cut to 80 characters


def parse_error(text: str) -> ReportParseError:
    with pytest.raises(ReportParseError) as caught:
        parse_report(text, "report.txt")
    message = str(caught.value)
    assert message.isprintable() and len(message) <= LONGEST_ERROR, message
    assert message.startswith(f"report.txt:{caught.value.line}: ")
    return caught.value


def report(metric: tuple[str, str] = ("2", "4.00"), counter: str = "7", percentiles: str = "50%=4.00") -> str:
    total_samples, accumulator = metric
    return (
        f"Metric: InputOutputAliasCount\n  TotalSamples: {total_samples}\n  Accumulator: {accumulator}\n"
        f"  Percentiles: {percentiles}\nCounter: MarkStep\n  Value: {counter}\n"
    )


def test_the_helper_report_is_valid():
    snapshot = parse_report(report())
    assert snapshot.counters == {"MarkStep": 7} and snapshot.metrics["InputOutputAliasCount"].accumulator == 4.0


@pytest.mark.parametrize("path", ALL_REPORTS, ids=lambda path: path.name)
def test_no_real_report_holds_a_negative_or_unbounded_value(path):
    """The rules below reject nothing torch_xla writes: every fixture still parses, and exports only counters >= 0."""
    for _, snapshot in parse_report_stream(path.read_text(), path.name):
        for family in snapshot_families(snapshot, {"rank": "0"}):
            for sample in family.samples:
                assert math.isfinite(sample.value) and math.copysign(1.0, sample.value) > 0, sample


# ----- counts: whole, not negative, 64-bit


@pytest.mark.parametrize("text", ["-1", "-0"])
def test_negative_counts(text):
    error = parse_error(report(counter=text))
    assert (
        error.line == 6
        and error.problem == f'bad Value of counter "MarkStep": "{text}" is negative, and a count cannot be'
    )
    error = parse_error(report(metric=(text, "4.00")))
    assert error.line == 2 and "is negative" in error.problem


@pytest.mark.parametrize("digits", [21, 400, 4301, 100_000])
def test_counts_with_too_many_digits(digits):
    """int() refuses more than 4300 digits with a ValueError; the parser says what is wrong instead."""
    error = parse_error(report(counter="9" * digits))
    assert error.line == 6 and error.problem.startswith('bad Value of counter "MarkStep": "999')
    assert error.problem.endswith('" is too large for a 64-bit count')
    assert "too large" in parse_error(report(metric=("9" * digits, "4.00"))).problem


def test_the_largest_counts():
    assert parse_report(report(counter=str(2**64 - 1))).counters["MarkStep"] == 2**64 - 1
    assert parse_report(report(counter="000" + str(2**64 - 1))).counters["MarkStep"] == 2**64 - 1
    assert "too large" in parse_error(report(counter=str(2**64))).problem
    assert parse_report(report(counter="0" * 5000 + "3")).counters["MarkStep"] == 3


def test_unicode_digits_are_not_a_count():
    assert "is not a whole number" in parse_error(report(counter="\u0663")).problem  # ARABIC-INDIC DIGIT THREE


def test_step_with_too_many_digits():
    text = f"[MetricsData; step={'9' * 5000}]\n" + report()
    with pytest.raises(ReportParseError) as caught:
        list(parse_report_stream(text, "dump.txt"))
    assert str(caught.value).startswith('dump.txt:1: unknown line "[MetricsData; step=999')


# ----- accumulators: exported as counters, so finite and not negative


@pytest.mark.parametrize("accumulator", ["-3.00", "-0.00", "-1.00KB", "-0.00B"])
def test_negative_accumulators(accumulator):
    error = parse_error(report(metric=("2", accumulator)))
    assert error.line == 3
    assert error.problem == (
        f'bad Accumulator of metric "InputOutputAliasCount": "{accumulator}" is negative, and a '
        f"sum of times, sizes or counts cannot be"
    )


@pytest.mark.parametrize(
    "accumulator, problem",
    [
        ("nan", '"nan" is not a number'),
        ("-nan", '"-nan" is not a number'),
        ("nanB", '"nanB" is not a number'),
        ("0000nanus", '"0000nanus" is not a number'),
        ("inf", '"inf" is too large (more than 2^64 number)'),
        ("-inf", '"-inf" is too large'),
        ("infKB", '"infKB" is too large (more than 2^64 bytes)'),
        ("1" * 400 + ".00", '"1111'),
        ("1" * 20 + ".00PB", "is too large (more than 2^64 bytes)"),
        ("9" * 5000 + "d00h00m00s000ms000.000us", "is too large (more than 2^64 seconds)"),
    ],
)
def test_accumulators_that_are_not_finite_numbers(accumulator, problem):
    error = parse_error(report(metric=("2", accumulator)))
    assert error.line == 3 and problem in error.problem, error.problem


def test_nan_stays_readable_where_old_reports_print_it():
    snapshot = parse_report(report(percentiles="50%=nan; 90%=4.00"))
    assert math.isnan(snapshot.metrics["InputOutputAliasCount"].percentiles[0.5])


@pytest.mark.parametrize(
    "percentiles, problem",
    [
        ("50%=inf", 'bad 50% percentile of metric "InputOutputAliasCount": "inf" is too large'),
        ("50%=" + "9" * 30 + ".00", "is too large"),
        ("150%=4.00", '"150"% is not between 0% and 100%'),
        ("-1%=4.00", '"-1"% is not between 0% and 100%'),
        ("nan%=4.00", '"nan"% is not between'),
        ("1e400%=4.00", '"1e400"% is not between'),
    ],
)
def test_percentiles_out_of_range(percentiles, problem):
    error = parse_error(report(percentiles=percentiles))
    assert error.line == 4 and problem in error.problem, error.problem


# ----- what an error shows of the text: cut, escaped, with the file and line


def test_a_huge_line_is_cut_in_the_error():
    text = report() + "x" * 10_000_000 + "\n"
    error = parse_error(text)
    assert str(error) == (
        f'report.txt:7: unknown line "{"x" * 80}..." (expected "Metric: <name>" or "Counter: <name>")'
    )


def test_control_characters_are_escaped_in_the_error():
    error = parse_error(report() + "\x1b[31mred\x1b[0m \\ \u202e\t\x00\n")
    assert error.problem.startswith('unknown line "\\x1b[31mred\\x1b[0m \\\\ \\u202e\\t\\x00"')


def test_a_huge_value_is_cut_in_the_error():
    error = parse_error(report(metric=("2", "\x1b" * 1000 + "B")))
    assert error.line == 3 and '"' + "\\x1b" * 20 + '..." is not a size like 450.04KB' in error.problem


@pytest.mark.parametrize("kind", ["Metric", "Counter"])
def test_a_name_with_a_control_character(kind):
    error = parse_error(f"{kind}: aten::\x1b[2Jlgamma\n  Value: 3\n")
    assert str(error) == f'report.txt:1: bad {kind} name "aten::\\x1b[2Jlgamma": it has a non-printable character'


def test_a_long_name_is_cut_in_the_error():
    error = parse_error(f"Counter: {'a' * 1_000_000}\n  Value: x\n")
    assert error.line == 2 and error.problem.startswith(f'bad Value of counter "{"a" * 80}..."')


def test_the_file_name_is_escaped():
    with pytest.raises(ReportParseError) as caught:
        parse_report("nonsense\n", "a\x1bb\nc.txt")
    assert str(caught.value).startswith('a\\x1bb\\nc.txt:1: unknown line "nonsense"')


@pytest.mark.parametrize("newline", ["\r\n", "\r"])
def test_line_numbers_with_other_line_ends(newline):
    assert parse_error(report(counter="x").replace("\n", newline)).line == 6


@pytest.mark.parametrize("separator", ["\x0b", "\x0c", "\x1c", "\x85", "\u2028"])
def test_only_newlines_end_a_line(separator):
    """str.splitlines() also splits at these; an editor does not, so a line number counted that way would be off."""
    text = f"Counter: MarkStep\n  Value: 7{separator}Counter: X\n  Value: -\n"
    assert parse_error(text).line == 2
