"""What serving a 128-rank node costs a training job: a real torch_xla trainer as rank 0, 127 simulated ranks.

Rank 0 is a real training loop on the XLA CPU device with ``neuron_exporter.attach()`` and the default
``node_view``: it serves the node endpoint for its run. Ranks 1 to 127 are one process that writes their spool
files, each with --ops fallback-operator series, rewrites them every --rewrite seconds (a rank's default spool
interval) and holds their locks. The trainer records the time of every step. This script scrapes the node endpoint
as Prometheus does (gzip), in phases of --phase seconds:

- idle: no scrapes;
- 1/s: one scrape a second;
- back-to-back: scrapes one after another on one kept-alive connection.

Each scraped phase sits between two idle phases, and its step rate is divided by theirs (their mean), so a ratio
compares moments close together on a shared machine. Prints, per kind of phase, every round's ratio and their
median, the scrapes made and their size.

    PJRT_DEVICE=CPU python benchmarks/node_scale.py [--ranks 128] [--ops 200] [--rounds 3] [--phase 8]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WRITER = ROOT / "tests" / "scripts" / "spool_writer.py"
SCRAPED_TRAINER = ROOT / "benchmarks" / "scraped_trainer.py"


def scrape_loop(url: str, stop: threading.Event, period: float | None, counts: dict) -> None:
    """Scrape until ``stop``: once every ``period`` seconds, or back to back (None), on one connection."""
    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    next_time = time.monotonic()
    while not stop.is_set():
        connection.request("GET", parts.path, headers={"Accept-Encoding": "gzip"})
        response = connection.getresponse()
        body = response.read()
        assert response.status == 200, response.status
        counts["scrapes"] += 1
        counts["bytes"] = len(body)
        if period is not None:
            next_time += period
            stop.wait(max(0.0, next_time - time.monotonic()))
    connection.close()


def rate(times: list[float], start: float, end: float) -> float:
    return sum(1 for t in times if start <= t < end) / (end - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=128)
    parser.add_argument("--ops", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--phase", type=float, default=8.0, help="seconds per phase")
    parser.add_argument("--rewrite", type=float, default=2.0)
    args = parser.parse_args()

    env = {**os.environ, "NEURON_EXPORTER_RUN_ID": f"bench-{os.getpid()}", "PJRT_DEVICE": "CPU"}
    kinds = {"1/s": 1.0, "back-to-back": None}
    windows: list[tuple[str, float, float]] = []
    counts = {kind: {"scrapes": 0, "bytes": 0} for kind in kinds}
    with tempfile.TemporaryDirectory() as spool:
        stop_file = Path(spool).parent / f"neuron-exporter-node-scale-{os.getpid()}.stop"
        stop_file.write_text("")
        ranks = subprocess.Popen(
            [
                sys.executable,
                str(WRITER),
                spool,
                f"1-{args.ranks - 1}",
                "--ops",
                str(args.ops),
                "--steps",
                "1000",
                "--rewrite",
                str(args.rewrite),
            ],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert ranks.stdout.readline().strip() == "ready"
        trainer = subprocess.Popen(
            [sys.executable, str(SCRAPED_TRAINER), spool, str(stop_file)],
            env=env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            url = json.loads(trainer.stdout.readline())["url"]
            time.sleep(args.phase)  # settle: the first spool writes, the endpoint's first reads
            for _ in range(args.rounds):
                for kind, period in kinds.items():
                    start = time.monotonic()
                    time.sleep(args.phase)
                    windows.append(("idle", start, time.monotonic()))
                    stop = threading.Event()
                    thread = threading.Thread(target=scrape_loop, args=(url, stop, period, counts[kind]))
                    start = time.monotonic()
                    thread.start()
                    time.sleep(args.phase)
                    stop.set()
                    thread.join()
                    windows.append((kind, start, time.monotonic()))
            start = time.monotonic()
            time.sleep(args.phase)
            windows.append(("idle", start, time.monotonic()))
            stop_file.write_text("stop")
            times = json.loads(trainer.stdout.readline())["times"]
        finally:
            trainer.kill()
            trainer.wait()
            ranks.stdin.close()
            ranks.wait()
            stop_file.unlink(missing_ok=True)

    rates = [(kind, rate(times, start, end)) for kind, start, end in windows]
    print(
        f"node endpoint of a training job: rank 0 a real torch_xla trainer, {args.ranks - 1} simulated ranks x "
        f"{args.ops} fallback-operator series rewritten every {args.rewrite:g} s; {args.rounds} rounds of "
        f"{args.phase:g} s phases"
    )
    idle = [r for kind, r in rates if kind == "idle"]
    print(f"  idle step rate: {statistics.median(idle):.0f} steps/s (from {min(idle):.0f} to {max(idle):.0f})")
    for kind in kinds:
        ratios = [r / ((rates[i - 1][1] + rates[i + 1][1]) / 2) for i, (k, r) in enumerate(rates) if k == kind]
        shown = ", ".join(f"{ratio:.3f}" for ratio in ratios)
        print(
            f"  {kind:13s} step rate / idle: median {statistics.median(ratios):.3f} (rounds: {shown}); "
            f"{counts[kind]['scrapes']} scrapes of {counts[kind]['bytes'] / 1024:.0f} KiB gzipped"
        )


if __name__ == "__main__":
    main()
