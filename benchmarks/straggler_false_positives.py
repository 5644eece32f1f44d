"""TrainingStraggler's false positives on synthetic balanced runs: how often it would fire, and how close the ranks'
noise comes to its threshold, over many 64-rank data-parallel runs of hours, at several levels of noise
(tests/support/straggler_series.py: ranks that differ for good and from scrape to scrape in their waits for data
and on the device, one-off compilations, rank 0's checkpoints).

The runs' series are written as OpenMetrics and loaded into a real Prometheus (2.42, installed) with ``promtool
tsdb create-blocks-from openmetrics``. Prometheus evaluates the shipped alert's expression, its recording rules
written out in it and its threshold at 0, at every 15 s of the runs (a range query: what the rule evaluations would
have computed), and the script applies the threshold and the ``for``: a rank and phase fires when the excess stays
above the threshold at every evaluation for ``straggler_for``. Per noise level it prints the rank-hours judged, the
alerts that would have fired and the episodes above the threshold that the ``for`` rode out, and each run's largest
excess share (median and largest over the runs).

    python benchmarks/straggler_false_positives.py [--runs 10] [--ranks 64] [--hours 2] [--seed 38]
"""

from __future__ import annotations

import argparse
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from neuron_exporter.mixin.config import DEFAULTS, config_from  # noqa: E402
from neuron_exporter.mixin.rules.straggler import straggler_alerts, straggler_recording_rules  # noqa: E402
from tests.support.prometheus import running_prometheus  # noqa: E402
from tests.support.straggler_series import INTERVAL, Noise, run_series  # noqa: E402

# Noise levels of balanced runs (a 0.5 s step): the promtool test's; input a tenth of the step, ranks 20% apart for
# good, compilations five times and checkpoints twice as often and longer; input 30% of the step, ranks 10% apart.
LEVELS = {
    "moderate": Noise(),
    "noisy": Noise(data=0.05, host_sync=0.02, bias=0.2, compile_chance=0.01, compile_seconds=5,
                   checkpoint_every=20, checkpoint_seconds=5),
    "input-bound": Noise(data=0.15, host_sync=0.02, bias=0.1, compile_chance=0.01, compile_seconds=5,
                         checkpoint_every=20, checkpoint_seconds=5),
}  # fmt: skip


STRAGGLER = 13


def excess_of(run: str) -> str:
    """The alert's expression for one run, its threshold at 0 and its recorded series written out: each judged
    rank's largest excess share when above the median."""
    config = config_from({"straggler_excess_share": 0, "selector": f'{DEFAULTS.selector}, run_id="{run}"'})
    recorded = straggler_recording_rules(config)
    (rule,) = straggler_alerts(config)
    expr = rule["expr"]
    pattern = re.compile(
        r"(?<![\w:])(" + "|".join(map(re.escape, sorted(recorded, key=len, reverse=True))) + r")(?![\w:])"
    )
    while pattern.search(expr):
        expr = pattern.sub(lambda match: f"({recorded[match.group(1)]})", expr)
    assert not re.search(r"[a-z_]+:[a-z_]+:[a-z0-9_]+", expr), f"a recorded series is left in {expr}"
    return expr


def openmetrics(path: Path, runs: dict[str, list[tuple[str, list[float]]]], start: float) -> None:
    """Every run's series, one family after another, each series' samples in time order."""
    by_family: dict[str, list[tuple[str, list[float]]]] = {}
    for series in runs.values():
        for name, values in series:
            # OpenMetrics has no spaces between labels
            by_family.setdefault(name.split("{", 1)[0], []).append((name.replace(", ", ","), values))
    with path.open("w") as out:
        for family, members in by_family.items():
            out.write(f"# TYPE {family} unknown\n")
            for name, values in members:
                out.write("".join(f"{name} {v:.4f} {start + i * INTERVAL:.0f}\n" for i, v in enumerate(values)))
        out.write("# EOF\n")


def streaks(points: list[tuple[float, float]], threshold: float) -> list[int]:
    """The lengths, in evaluations, of the runs of consecutive evaluations above ``threshold`` (a missing point, no
    value at that evaluation, ends a run)."""
    found: list[int] = []
    length, last = 0, None
    for timestamp, value in points:
        if value > threshold:
            if length and last is not None and timestamp - last > INTERVAL:
                found.append(length)
                length = 0
            length += 1
        elif length:
            found.append(length)
            length = 0
        last = timestamp
    return found + ([length] if length else [])


def judged(
    series: list[dict], start: float, threshold: float, for_evaluations: int
) -> tuple[list[str], int, float, float]:
    """Of one run's range query: the alerts that would fire (rank, phase, minute of the run they fire at), the
    episodes above the threshold, the longest one (minutes) and the largest excess share."""
    alerts, episodes, longest, largest = [], 0, 0.0, 0.0
    for one in series:
        points = [(float(t), float(v)) for t, v in one["values"]]
        largest = max([largest] + [v for _, v in points])
        lengths = streaks(points, threshold)
        episodes += len(lengths)
        longest = max([longest] + [length * INTERVAL / 60 for length in lengths])
        if any(length >= for_evaluations for length in lengths):
            above = [t for t, v in points if v > threshold]
            fires = (above[0] - start) / 60 + (for_evaluations - 1) * INTERVAL / 60
            alerts.append(f"rank {one['metric']['rank']} {one['metric']['phase']} (from minute {fires:.0f})")
    return alerts, episodes, longest, largest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="balanced runs per noise level")
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--hours", type=float, default=2)
    parser.add_argument("--seed", type=int, default=38)
    args = parser.parse_args()

    rng = random.Random(args.seed)
    samples = int(args.hours * 3600 / INTERVAL)
    runs = {}
    for level, noise in LEVELS.items():
        for number in range(args.runs):
            runs[f"{level}-{number}"] = run_series(f"{level}-{number}", args.ranks, samples, rng, noise)
        # and one run whose rank STRAGGLER waits 0.075 s more a step for data: 15% of the 0.5 s step
        runs[f"{level}-straggler"] = run_series(f"{level}-straggler", args.ranks, samples, rng, noise, STRAGGLER, 0.075)
    threshold = DEFAULTS.straggler_excess_share
    for_evaluations = int(DEFAULTS.straggler_for.rstrip("m")) * 60 // INTERVAL + 1
    results = {}
    with tempfile.TemporaryDirectory() as work:
        directory = Path(work)
        start = time.time() - args.hours * 3600 - 900
        openmetrics(directory / "runs.om", runs, start)
        blocks = ["promtool", "tsdb", "create-blocks-from", "openmetrics", str(directory / "runs.om")]
        subprocess.run([*blocks, str(directory / "data")], check=True, stdout=subprocess.DEVNULL)
        (directory / "runs.om").unlink()
        with running_prometheus({"global": {"scrape_interval": "1h"}}, directory) as prometheus:
            end = start + samples * INTERVAL
            for run in runs:  # one query a run: a range query over all of them takes longer than the API's timeout
                result = prometheus.query_range(excess_of(run), start, end, step=f"{INTERVAL}s")
                assert result["status"] == "success" and result["data"]["result"], (run, result)
                results[run] = judged(result["data"]["result"], start, threshold, for_evaluations)
    print(
        f"{args.runs} balanced runs of {args.ranks} ranks per level, {args.hours:g} h each "
        f"({args.runs * args.ranks * args.hours:g} rank-hours), judged every {INTERVAL} s "
        f"(threshold {threshold:.0%}, for {DEFAULTS.straggler_for}: {for_evaluations} evaluations)"
    )
    for level in LEVELS:
        balanced = [results[f"{level}-{number}"] for number in range(args.runs)]
        alerts = [alert for result in balanced for alert in result[0]]
        largest = [result[3] for result in balanced]
        print(
            f"  {level:<12} alerts {len(alerts)}{alerts or ''}; episodes above the threshold "
            f"{sum(r[1] for r in balanced)} (longest {max(r[2] for r in balanced):.1f} min); largest excess of a "
            f"run: median {statistics.median(largest):.1%}, max {max(largest):.1%}"
        )
        alerts, _, _, largest_one = results[f"{level}-straggler"]
        print(f"  {'':<12} with a 15% straggler (rank {STRAGGLER}, data): alerts {alerts}, excess {largest_one:.1%}")


if __name__ == "__main__":
    main()
