"""TrainingStraggler on real data-parallel runs of this machine: whether it stays silent on a balanced run and names
the rank and the phase of a straggler, and how far from its threshold the ranks' noise comes.

Each run is ``neuron-exporter run -- torchrun --standalone --nproc-per-node N benchmarks/data_parallel_trainer.py``
(gloo on the CPU: the ranks share the machine's cores), scraped every 15 s by a real Prometheus (2.42, installed)
that evaluates the shipped rules (deploy/prometheus/rules) every 15 s. When the run ends, the script prints the
evaluations at which a rank was judged (the alert's conditions but its threshold held), the largest excess share
any rank reached in any phase, by rank and phase, and every TrainingStraggler alert that was pending or fired.

    python benchmarks/straggler_runs.py [--ranks 4] [--minutes 30] [--runs 1] [--slow-rank R] [--slow-seconds 0.05]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from neuron_exporter.mixin.config import config_from  # noqa: E402
from neuron_exporter.mixin.rules.straggler import straggler_alerts  # noqa: E402
from tests.support.daemon import free_port  # noqa: E402
from tests.support.prometheus import Prometheus, running_prometheus  # noqa: E402

RULES = ROOT / "deploy" / "prometheus" / "rules"
TRAINER = ROOT / "benchmarks" / "data_parallel_trainer.py"
BIN = Path(sys.executable).parent
INTERVAL = 15  # seconds: the shipped scrape and evaluation intervals


def judged_excess() -> str:
    """The alert's expression with a threshold of 0: each judged rank's largest excess share, when positive."""
    (rule,) = straggler_alerts(config_from({"straggler_excess_share": 0}))
    return rule["expr"]


def report(prometheus: Prometheus, minutes: float) -> None:
    window = f"{int(minutes * 60) + 60}s"
    judged = judged_excess()
    evaluations = prometheus.query(f"count_over_time((count({judged}) > 0)[{window}:{INTERVAL}s])")
    print(f"  evaluations at which the run's ranks were judged: {int(sum(values(evaluations)))}")
    largest = prometheus.query(f"max_over_time(({judged})[{window}:{INTERVAL}s])")["data"]["result"]
    print("  largest excess share over the run, by rank and phase (the threshold is 10%):")
    for sample in sorted(largest, key=lambda s: -float(s["value"][1]))[:8]:
        labels = sample["metric"]
        print(f"    rank {labels['rank']:>3} {labels['phase']:<10} {float(sample['value'][1]):7.2%}")
    for state in ("pending", "firing"):
        alerts = prometheus.query(
            f'max_over_time(ALERTS{{alertname="TrainingStraggler", alertstate="{state}"}}[{window}])'
        )["data"]["result"]
        found = [f"rank {a['metric']['rank']} {a['metric']['phase']}" for a in alerts]
        print(f"  TrainingStraggler {state}: {found or 'none'}")
    steps = prometheus.query(f"sum by (rank) (increase(training_steps_total[{window}]))")["data"]["result"]
    print(f"  steps by rank: {sorted((int(s['metric']['rank']), round(float(s['value'][1]))) for s in steps)}")


def values(result: dict) -> list[float]:
    return [float(sample["value"][1]) for sample in result["data"]["result"]]


def one_run(args: argparse.Namespace, number: int) -> None:
    with tempfile.TemporaryDirectory() as work:
        directory = Path(work)
        shutil.copytree(RULES, directory / "rules", ignore=shutil.ignore_patterns("tests"))
        port = free_port()
        config = {
            "global": {"scrape_interval": f"{INTERVAL}s", "evaluation_interval": f"{INTERVAL}s"},
            "rule_files": [str(path) for path in sorted((directory / "rules").glob("*.yml"))],
            "scrape_configs": [{"job_name": "neuron-exporter", "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}],
        }
        trainer = [str(TRAINER), "--seconds", str(args.minutes * 60)]
        if args.slow_rank is not None:
            trainer += ["--slow-rank", str(args.slow_rank), "--slow-seconds", str(args.slow_seconds)]
        command = [
            *(str(BIN / "neuron-exporter"), "run", "--addr", "127.0.0.1", "--port", str(port)),
            *("--spool-dir", str(directory / "spool"), "--"),
            *(str(BIN / "torchrun"), "--standalone", "--nproc-per-node", str(args.ranks), *trainer),
        ]
        with running_prometheus(config, directory) as prometheus:
            started = time.monotonic()
            with open(directory / "run.log", "w") as log:
                code = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT).returncode
            if code != 0:
                sys.exit(f"the run failed ({code}):\n{(directory / 'run.log').read_text()[-3000:]}")
            slow = "balanced" if args.slow_rank is None else f"rank {args.slow_rank} +{args.slow_seconds:g} s a batch"
            print(f"run {number}: {args.ranks} ranks, {slow}, {(time.monotonic() - started) / 60:.1f} min")
            report(prometheus, args.minutes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--minutes", type=float, default=30)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--slow-rank", type=int, default=None)
    parser.add_argument("--slow-seconds", type=float, default=0.05)
    args = parser.parse_args()
    for number in range(1, args.runs + 1):
        one_run(args, number)


if __name__ == "__main__":
    main()
