"""The metrics_report() parser against reports captured from real torch_xla 2.9 runs and their exact values."""

from __future__ import annotations

import json
import math
import random
import re

import pytest

from neuron_exporter.reports.report_parser import (
    DURATION,
    ReportParseError,
    parse_bytes,
    parse_duration,
    parse_report,
    parse_report_stream,
    parse_value,
)
from neuron_exporter.snapshot import BYTES, NUMBER, SECONDS, unit_of
from neuron_exporter.snapshot_metrics import HOST_SCALAR_READ_OP, is_cpu_fallback_op
from tests.support.paths import FIXTURES as TEST_FIXTURES

FIXTURES = TEST_FIXTURES / "reports"
SCENARIOS = (
    "plain",
    "item",
    "fallback",
    "dynshape",
    "mix",
    "torchvision",
    "compile_loader",
    "compile_loader_fallback",
    "step_item",
    "step_item_after",
)
# Captured with the markers that ran a graph counted around torch_xla._XLAC._xla_step_marker.
COUNTED_SCENARIOS = [
    name for name in SCENARIOS if "markers" in json.loads((FIXTURES / f"{name}.truth.json").read_text())
]
DEFAULT_PERCENTILES = {0.01, 0.05, 0.1, 0.2, 0.5, 0.8, 0.9, 0.95, 0.99}


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def truth(scenario: str) -> dict:
    return json.loads(fixture(f"{scenario}.truth.json"))


def bytes_tolerance(value: float) -> float:
    """Half a unit of the second decimal of the 1024-based unit torch_xla printed ``value`` in."""
    scale = 1.0
    while value >= 1024.0 * scale and scale < 1024.0**5:
        scale *= 1024.0
    return 0.005 * scale + 1e-9


def assert_matches_truth(snapshot, expected: dict, only_present: bool = False) -> None:
    counters, metrics = expected["counters"], expected["metrics"]
    if only_present:
        counters = {name: value for name, value in counters.items() if name in snapshot.counters}
        metrics = {name: value for name, value in metrics.items() if name in snapshot.metrics}
    assert snapshot.counters == counters
    assert set(snapshot.metrics) == set(metrics)
    for name, (total_samples, accumulator) in metrics.items():
        parsed = snapshot.metrics[name]
        assert parsed.total_samples == total_samples, name
        assert parsed.unit == unit_of(name), name  # the unit learnt from the text agrees with the table
        if parsed.unit == SECONDS:
            # printed to the nanosecond; exact once the rounding quirk is undone
            assert abs(parsed.accumulator * 1e9 - accumulator) <= 0.5 + 1e-6 * parsed.accumulator, name
        elif parsed.unit == BYTES:
            assert abs(parsed.accumulator - accumulator) <= bytes_tolerance(accumulator), name
        else:
            assert abs(parsed.accumulator - accumulator) <= 0.005 + 1e-9, name


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_full_report_matches_the_values_read_at_the_same_moment(scenario):
    snapshot = parse_report(fixture(f"{scenario}.report.txt"), f"{scenario}.report.txt")
    assert_matches_truth(snapshot, truth(scenario))
    # MarkStep counts every sync: one per step in a plain loop, more under torch_xla.step(), compile() and loaders
    assert snapshot.counter("MarkStep") == truth(scenario).get("markers", truth(scenario)["steps"])


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_short_report_matches_the_same_values(scenario):
    snapshot = parse_report(fixture(f"{scenario}.short.txt"), f"{scenario}.short.txt")
    assert_matches_truth(snapshot, truth(scenario), only_present=True)
    assert "CompileTime" in snapshot.metrics and "MarkStep" in snapshot.counters
    counters = truth(scenario)["counters"]
    aten = {name for name in counters if name.startswith("aten::")}
    assert aten <= set(snapshot.counters)  # short_metrics_report() always lists every aten:: counter
    other_fallback = {name for name in counters if is_cpu_fallback_op(name) and not name.startswith("aten::")}
    assert not other_fallback & set(snapshot.counters)  # ... and no other namespace's (torchvision::)


def test_scenarios_show_what_they_were_made_for():
    assert "aten::lgamma" in truth("fallback")["counters"] and "aten::digamma" in truth("fallback")["counters"]
    assert truth("item")["counters"]["aten::_local_scalar_dense"] == truth("item")["steps"]
    assert truth("dynshape")["counters"]["UncachedCompile"] == truth("dynshape")["steps"]
    assert not any(name.startswith("aten::") for name in truth("plain")["counters"])
    assert {name for name in truth("torchvision")["counters"] if is_cpu_fallback_op(name)} == {
        "torchvision::roi_align",
        "torchvision::_roi_align_backward",
        "torchvision::nms",
    }
    for scenario in ("compile_loader", "compile_loader_fallback", "step_item", "step_item_after"):
        expected = truth(scenario)
        assert expected["markers"] > expected["markers_with_graph"] == expected["steps"], scenario  # empty syncs
    assert truth("compile_loader_fallback")["graph_cuts"] == 2 * truth("compile_loader_fallback")["steps"]
    assert truth("step_item")["graph_cuts"] == truth("step_item")["steps"]
    assert truth("step_item_after")["graph_cuts"] == 0


@pytest.mark.parametrize("scenario", COUNTED_SCENARIOS)
def test_fallback_counters_are_the_operators_torch_xla_ran_on_the_cpu(scenario):
    """Every namespace::op counter but xla:: is one torch_xla's fallback made (met.executed_fallback_ops())."""
    expected = truth(scenario)
    counters = parse_report(fixture(f"{scenario}.report.txt")).counters
    fallback = {name for name in counters if is_cpu_fallback_op(name)}
    assert set(expected["executed_fallback_ops"]) == fallback | ({HOST_SCALAR_READ_OP} & set(counters))


def test_percentiles_are_read_in_base_units():
    text = fixture("mix.report.txt")
    metrics = parse_report(text).metrics
    for metric in metrics.values():
        assert set(metric.percentiles) == DEFAULT_PERCENTILES
    for name, read in (("CompileTime", parse_duration), ("OutboundData", parse_bytes)):
        line = re.search(rf"Metric: {name}\n(?:  .*\n)*?  Percentiles: (.*)\n", text).group(1)
        printed = dict(entry.split("%=") for entry in line.split("; "))
        assert metrics[name].percentiles == {int(p) / 100: read(v) for p, v in printed.items()}
    assert metrics["OutboundData"].percentiles[0.99] >= 1024  # printed in KB, kept in bytes
    compile_time = metrics["CompileTime"]
    assert 0 < min(compile_time.percentiles.values()) <= max(compile_time.percentiles.values()) < 10


def naive_seconds(text: str) -> float:
    """Reads each field at face value, as a parser that does not know torch_xla's rounding would."""
    fields = DURATION.fullmatch(text).groups()
    scales = (86400, 3600, 60, 1, 1e-3, 1e-6)
    return sum(float(field or 0) * scale for field, scale in zip(fields, scales, strict=False))


def test_rounding_fix_is_needed_and_right_on_real_reports():
    naive_wrong = checked = 0
    for scenario in SCENARIOS:
        text = fixture(f"{scenario}.report.txt")
        metrics = truth(scenario)["metrics"]
        for name, printed in re.findall(r"Metric: (\S+)\n  TotalSamples: \d+\n  Accumulator: (\S+us)\n", text):
            checked += 1
            true_ns = metrics[name][1]
            naive_wrong += abs(naive_seconds(printed) * 1e9 - true_ns) > 1
            assert abs(parse_duration(printed) * 1e9 - true_ns) <= 0.5 + 1e-6 * true_ns, (scenario, name, printed)
    assert checked >= 40
    assert naive_wrong > 0  # the captured reports do contain the quirk


def test_rounding_fix_on_a_known_case():
    # metric_data('ExecuteTime') said 44,763,787 ns; metrics_report() printed 045ms763.787us.
    assert naive_seconds("045ms763.787us") == pytest.approx(0.045763787, abs=1e-12)
    assert parse_duration("045ms763.787us") == pytest.approx(0.044763787, abs=1e-12)


def torch_xla_duration(ns: float) -> str:
    """The duration text torch_xla 2.9 prints (MetricFnTime): each field but the last rounded, then floored off."""
    parts = (
        ("d", 86400e9, 2, 0),
        ("h", 3600e9, 2, 0),
        ("m", 60e9, 2, 0),
        ("s", 1e9, 2, 0),
        ("ms", 1e6, 3, 0),
        ("us", 1e3, 7, 3),
    )
    text, started = "", False
    for i, (suffix, scale, width, precision) in enumerate(parts):
        value = ns / scale
        if value >= 1.0 or started or i == len(parts) - 1:
            text += f"{value:0{width}.{precision}f}{suffix}"
            ns -= math.floor(value) * scale
            started = True
    return text


@pytest.mark.parametrize(
    "ns",
    [
        0,
        410,
        999_999,
        1_000_000,
        44_763_787,
        390_043_556,
        499_500_000,
        999_600_000,
        1_500_000_000,
        59_700_000_000,
        89_999_999_999,
        3_599_999_999_999,
        5_400_000_000_000,
        86_399_999_999_999,
        43_200_000_000_000 + 86_400_000_000_000,
        1_000_000_000_000_000,
    ],
)
def test_every_duration_form_round_trips(ns):
    text = torch_xla_duration(ns)
    assert abs(parse_duration(text) * 1e9 - ns) <= 0.5 + 1e-15 * ns, text


def test_random_durations_round_trip():
    rng = random.Random(20251122)
    for _ in range(5000):
        ns = float(rng.randrange(0, 10 ** rng.randint(1, 15)))
        text = torch_xla_duration(ns)
        assert abs(parse_duration(text) * 1e9 - ns) <= 0.5 + 1e-15 * ns, (ns, text)


@pytest.mark.parametrize(
    "text, seconds",
    [
        ("000.410us", 410e-9),
        ("390ms043.556us", 0.390043556),
        ("07s579ms722.347us", 6.578722347),  # both the seconds and the milliseconds were rounded up
        ("09s969ms486.408us", 8.969486408),  # the Neuron docs' example reads 8.97 s, not 9.97 s
        ("01m05s000ms000.000us", 65.0),
        ("02h29m00s000ms000.000us", 2 * 3600 + 29 * 60),
        ("03d13h00m00s000ms000.000us", 2 * 86400 + 13 * 3600),  # 13 h >= 12: the days were rounded up
        ("402ms77.015us", 0.402077015),  # 2019 reports did not pad the microseconds
        ("01s860ms629.700us", 1.8596297),  # a leading 1 is never a rounded-up 0
    ],
)
def test_duration_forms(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds, abs=1e-12)
    assert parse_value(text) == (pytest.approx(seconds, abs=1e-12), SECONDS)


@pytest.mark.parametrize("text", ["12ms", "000.41us", "1h05s000ms000.000us", "05s.100us", "us", "-001.000us"])
def test_malformed_durations(text):
    with pytest.raises(ValueError):
        parse_duration(text)


@pytest.mark.parametrize(
    "text, value",
    [
        ("40.00B", 40.0),
        ("8.00KB", 8192.0),
        ("450.04KB", 450.04 * 1024),
        ("1.65MB", 1.65 * 1024**2),
        ("2.00GB", 2 * 1024**3),
        ("1.00PB", 1024.0**5),
    ],
)
def test_sizes_are_1024_based(text, value):
    assert parse_bytes(text) == pytest.approx(value)
    assert parse_value(text) == (pytest.approx(value), BYTES)


def test_nan_values():
    assert math.isnan(parse_bytes("nanB"))
    assert math.isnan(parse_value("nan")[0])
    assert math.isnan(parse_duration("0000nanus"))


@pytest.mark.parametrize("text, value", [("4.00", 4.0), ("1949.00", 1949.0), ("0.00", 0.0), ("-3.50", -3.5)])
def test_numbers(text, value):
    assert parse_value(text) == (value, NUMBER)


@pytest.mark.parametrize("text", ["4", "4.0", "39.", "12.3xs", "4.00 B", ""])
def test_values_not_in_a_torch_xla_form(text):
    with pytest.raises(ValueError):
        parse_value(text)


def test_metrics_file_dump_yields_every_step():
    reports = list(parse_report_stream(fixture("metrics_file.fallback.txt"), "metrics_file.fallback.txt"))
    assert [step for step, _ in reports] == [0, 1, 2]
    for step, snapshot in reports:
        # XLA_METRICS_FILE is written inside torch_xla.sync(), after the step's MarkStep
        assert snapshot.counter("MarkStep") == step + 1
        assert snapshot.counter("aten::lgamma") == step + 1
        assert set(snapshot.metric("CompileTime").percentiles) == {0.5, 0.9, 0.99}  # XLA_METRICS_PERCENTILES
    for (_, before), (_, after) in zip(reports, reports[1:], strict=False):
        assert all(after.counter(name) >= value for name, value in before.counters.items())


def test_metrics_file_dump_of_a_step_loop_has_a_report_per_sync():
    reports = list(parse_report_stream(fixture("metrics_file.step_item.txt"), "metrics_file.step_item.txt"))
    assert [step for step, _ in reports] == list(range(8))  # 4 steps, each synced on entry and exit
    graphs = [snapshot.counter("CachedCompile") + snapshot.counter("UncachedCompile") for _, snapshot in reports]
    assert graphs == [0, 2, 2, 4, 4, 6, 6, 8]  # the entry syncs ran none; each exit sync one, after an .item()
    assert [snapshot.counter("MarkStep") for _, snapshot in reports] == list(range(1, 9))


def test_one_report_of_a_dump_is_one_report():
    text = fixture("metrics_file.fallback.txt")
    second = text.index("[MetricsData; step=1]")
    snapshot = parse_report(text[:second])
    assert snapshot.counter("MarkStep") == 1
    assert list(parse_report_stream(fixture("plain.report.txt"))) == [(None, parse_report(fixture("plain.report.txt")))]


def test_a_whole_dump_is_not_one_report():
    text = fixture("metrics_file.fallback.txt")
    line = text.splitlines().index("[MetricsData; step=1]") + 1
    with pytest.raises(ReportParseError) as error:
        parse_report(text, "dump.txt")
    assert str(error.value).startswith(f"dump.txt:{line}: a second report starts here")


def test_xrt_era_report():
    snapshot = parse_report(fixture("old_xrt.report.txt"))
    xrt_compile = snapshot.metrics["XrtCompile"]  # Mean: and StdDev: lines are read and left out
    assert (xrt_compile.total_samples, xrt_compile.unit) == (2, SECONDS)
    assert xrt_compile.accumulator == pytest.approx(10.131539676)
    assert set(xrt_compile.percentiles) == {0.25, 0.5, 0.8, 0.9, 0.95, 0.99}
    assert snapshot.metrics["XrtAllocateFromTensor_Bytes"].accumulator == 8192.0  # with "StdDev: nanB"
    assert snapshot.metrics["OutboundData"].accumulator == pytest.approx(450.04 * 1024)
    assert snapshot.metrics["TensorsGraphSize"].unit == NUMBER
    assert snapshot.metrics["TransferToServerTime"].accumulator == pytest.approx(0.060698791)
    assert snapshot.counters["aten::nonzero"] == 10


def test_2019_report_with_counter_in_place_of_accumulator():
    snapshot = parse_report(fixture("old_2019.report.txt"))
    assert snapshot.metrics["CompileTime"].total_samples == 12
    assert snapshot.metrics["CompileTime"].accumulator == pytest.approx(3.204117250)
    assert snapshot.metrics["ExecuteTime"].accumulator == pytest.approx(60 + 41.379902500)
    assert snapshot.metrics["ExecuteTime"].percentiles[0.9] == pytest.approx(0.189700300)  # 190ms700.300us
    assert snapshot.metrics["InboundData"].accumulator == pytest.approx(1.76 * 1024)
    assert snapshot.counters == {
        "CachedCompile": 888,
        "MarkStep": 450,
        "UncachedCompile": 12,
        "aten::_local_scalar_dense": 450,
    }


def test_report_pasted_with_indentation():
    text = "".join(f"   {line}\n" for line in fixture("plain.report.txt").splitlines())
    assert parse_report(text) == parse_report(fixture("plain.report.txt"))


def test_a_name_seen_twice_keeps_its_first_value():
    text = "Counter: aten::lgamma\n  Value: 3\nCounter: aten::lgamma\n  Value: 3\nCounter: MarkStep\n  Value: 1\n"
    assert parse_report(text).counters == {"aten::lgamma": 3, "MarkStep": 1}


# ----- malformed input: one line naming source:line and what is wrong

PLAIN = fixture("plain.report.txt").splitlines(keepends=True)


def line_of(prefix: str, after: int = 0) -> int:
    """1-based number of the first line of the plain fixture starting with ``prefix`` after line ``after``."""
    return next(i for i, line in enumerate(PLAIN, 1) if i > after and line.startswith(prefix))


def parse_error(text: str) -> ReportParseError:
    with pytest.raises(ReportParseError) as error:
        parse_report(text, "report.txt")
    message = str(error.value)
    assert "\n" not in message
    assert message == f"{error.value.source}:{error.value.line}: {error.value.problem}"
    return error.value


def replaced(number: int, line: str) -> str:
    lines = list(PLAIN)
    lines[number - 1] = line + "\n"
    return "".join(lines)


def test_bad_integer():
    number = line_of("  TotalSamples:")
    error = parse_error(replaced(number, "  TotalSamples: eight"))
    name = PLAIN[number - 2].split(": ")[1].strip()
    assert str(error) == f'report.txt:{number}: bad TotalSamples of metric "{name}": "eight" is not a whole number'


def test_bad_counter_value():
    number = line_of("  Value:")
    error = parse_error(replaced(number, "  Value: -"))
    assert error.line == number and "is not a whole number" in error.problem


def test_bad_value():
    number = line_of("  Accumulator:")
    error = parse_error(replaced(number, "  Accumulator: 12.3xs"))
    assert error.line == number
    assert error.problem.startswith('bad Accumulator of metric "') and '"12.3xs" is not a duration' in error.problem


def test_bad_percentile():
    number = line_of("  Percentiles:")
    error = parse_error(replaced(number, "  Percentiles: 1%=000.288us; five=000.395us"))
    assert error.line == number and 'expected "<p>%=<value>", got "five=000.395us"' in error.problem


def test_value_in_the_wrong_unit():
    number = line_of("  Percentiles:")
    error = parse_error(replaced(number, "  Percentiles: 1%=4.00B"))
    assert error.line == number and '"4.00B" is in bytes but the metric is in seconds' in error.problem


def test_unknown_line_between_blocks():
    number = line_of("Counter:")
    lines = list(PLAIN)
    lines.insert(number - 1, "some log line\n")
    error = parse_error("".join(lines))
    assert str(error) == (
        f'report.txt:{number}: unknown line "some log line" (expected "Metric: <name>" or "Counter: <name>")'
    )


def test_unknown_line_inside_a_block():
    number = line_of("  Accumulator:")
    name = PLAIN[number - 3].split(": ")[1].strip()
    error = parse_error(replaced(number, "  Mean: 000.288us"))
    assert str(error) == (
        f'report.txt:{number}: expected "  Accumulator: <value>" in Metric block "{name}", got "  Mean: 000.288us"'
    )


def test_block_cut_in_the_middle():
    number = line_of("  Percentiles:")  # drop the Percentiles line: the next block starts too soon
    lines = list(PLAIN)
    del lines[number - 1]
    error = parse_error("".join(lines))
    assert error.line == number and error.problem.startswith('expected "  Percentiles: <p>%=<value>; ..."')


def test_truncated_block_at_the_end_names_its_header():
    header = line_of("Metric:", after=line_of("Counter:"))  # a Metric block of the runtime arena
    text = "".join(PLAIN[: header + 2])  # header, TotalSamples, Accumulator
    name = PLAIN[header - 1].split(": ")[1].strip()
    error = parse_error(text)
    assert str(error) == (
        f'report.txt:{header}: Metric block "{name}" is truncated: the text ends before '
        f'"  Percentiles: <p>%=<value>; ..."'
    )


def test_truncated_counter_at_the_end():
    header = len(PLAIN) - 1
    assert PLAIN[header - 1].startswith("Counter:")
    error = parse_error("".join(PLAIN[:header]))
    assert error.line == header and "is truncated" in error.problem


def test_truncated_in_the_middle_of_a_value():
    number = line_of("  Percentiles:")
    text = "".join(PLAIN[: number - 1]) + PLAIN[number - 1][:-5]
    assert parse_error(text).line == number


def test_truncated_between_percentiles_of_the_last_line():
    number = line_of("  Percentiles:", after=line_of("  Percentiles:"))  # the second metric's
    cut = PLAIN[number - 1].index("; 50%=")
    error = parse_error("".join(PLAIN[: number - 1]) + PLAIN[number - 1][:cut])
    assert error.line == number and "is truncated" in error.problem and "4 percentiles" in error.problem


@pytest.mark.parametrize("text", ["", "\n\n", "   \n"])
def test_empty_input(text):
    error = parse_error(text)
    assert str(error) == 'report.txt:1: no report here: the text has no "Metric: <name>" or "Counter: <name>" block'


def test_line_numbers_count_across_a_dump():
    text = fixture("metrics_file.fallback.txt")
    lines = text.splitlines()
    number = len(lines) - lines[::-1].index("  Value: 3")  # a line of the last report
    lines[number - 1] = "  Value: three"
    with pytest.raises(ReportParseError) as error:
        list(parse_report_stream("\n".join(lines) + "\n", "dump.txt"))
    assert error.value.line == number and str(error.value).startswith(f"dump.txt:{number}: bad Value of counter")


def test_metric_block_without_total_samples():
    number = line_of("Metric:")
    name = PLAIN[number - 1].split(": ")[1].strip()
    error = parse_error(replaced(number + 1, "  Samples: 3"))
    assert str(error) == (
        f'report.txt:{number + 1}: expected "  TotalSamples: <int>" in Metric block "{name}", got "  Samples: 3"'
    )
