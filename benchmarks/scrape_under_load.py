"""Scrape latency while clients load the endpoint, and what that load costs a training job's step rate.

Three endpoints, each in turn:

- daemon: ``neuron-exporter serve`` over a spool of --ranks simulated ranks (tests/scripts/spool_writer.py);
- job endpoint: a real torch_xla training loop with ``attach()`` (the default ``node_view``: its node endpoint is
  a process of its own, which asks the training process for its exposition);
- rank endpoint: the same loop with ``attach(node_view=False)``: served in the training process itself.

For each, in phases of --phase seconds: idle, 8 connections pipelining 2,000 ``HEAD /metrics`` each and never
reading, idle, 64 clients scraping back to back, idle, 300 addresses holding one idle connection each and opening
it again when it is closed, idle (the loads: tests/scripts/http_load.py, a process of their own). Through every
phase a scraper takes one scrape every --interval seconds on a kept-alive connection with gzip, as Prometheus does
(in the crowd phase on a new connection each time, as a Prometheus that reconnects), and times it. Prints, per
phase kind, the scrape time's median, p99 and maximum, and for the trainers the step rate divided by the mean of
the idle phases around it.

Scrapes come every --interval seconds (0.6), under the two renders a second an endpoint makes past its burst, so
the idle times are those of serving a scrape, not of waiting for a turn; under load every render is shared by
whoever waits, and a scrape waits for the next one (at most half a second later, and its own time).

    PJRT_DEVICE=CPU python benchmarks/scrape_under_load.py [--phase 15] [--interval 0.6] [--ranks 16]
        [--endpoints daemon,job,rank]
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WRITER = ROOT / "tests" / "scripts" / "spool_writer.py"
SCRAPED_TRAINER = ROOT / "benchmarks" / "scraped_trainer.py"
LOAD = ROOT / "tests" / "scripts" / "http_load.py"
PHASES = ("idle", "pipeline", "idle", "polite", "idle", "crowd", "idle")


def scrape_times(url: str, stop: threading.Event, interval: float, times: list[float], reconnect: bool) -> None:
    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    next_time = time.monotonic()
    while not stop.is_set():
        start = time.perf_counter()
        if reconnect:
            connection.close()
        connection.request("GET", parts.path, headers={"Accept-Encoding": "gzip"})
        response = connection.getresponse()
        response.read()
        assert response.status == 200, response.status
        times.append(time.perf_counter() - start)
        next_time += interval
        stop.wait(max(0.0, next_time - time.monotonic()))
    connection.close()


@contextlib.contextmanager
def load(kind: str, port: int) -> Iterator[None]:
    if kind == "idle":
        yield
        return
    process = subprocess.Popen(
        [sys.executable, str(LOAD), kind, str(port), "--seconds", "600"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None and process.stdout.readline() == "ready\n"
    try:
        yield
    finally:
        process.communicate(timeout=120)


@contextlib.contextmanager
def spool_ranks(spool: str, ranks: int) -> Iterator[None]:
    writer = subprocess.Popen(
        [sys.executable, str(WRITER), spool, f"1-{ranks}", "--ops", "200", "--steps", "1000", "--rewrite", "2"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert writer.stdout is not None and writer.stdout.readline().strip() == "ready"
    try:
        yield
    finally:
        assert writer.stdin is not None
        writer.stdin.close()
        writer.wait()


@contextlib.contextmanager
def daemon(spool: str) -> Iterator[tuple[str, None]]:
    log = Path(spool).parent / f"neuron-exporter-bench-{os.getpid()}.log"
    with open(log, "w") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "neuron_exporter", "serve", "--addr", "127.0.0.1", "--port", "0"]
            + ["--spool-dir", spool],
            cwd=ROOT,
            stderr=out,
        )
    try:
        deadline = time.monotonic() + 60
        while not (found := re.search(r"listening on (\S+)", log.read_text())):
            assert time.monotonic() < deadline and process.poll() is None, log.read_text()
            time.sleep(0.05)
        yield found.group(1), None
    finally:
        process.terminate()
        process.wait()
        log.unlink(missing_ok=True)


@contextlib.contextmanager
def trainer(spool: str, kind: str, step_times: list[float]) -> Iterator[tuple[str, list[float]]]:
    stop_file = Path(spool).parent / f"neuron-exporter-bench-{os.getpid()}.stop"
    stop_file.write_text("")
    env = {**os.environ, "PJRT_DEVICE": "CPU", "NEURON_EXPORTER_RUN_ID": f"bench-{os.getpid()}-{kind}"}
    process = subprocess.Popen(
        [sys.executable, str(SCRAPED_TRAINER), spool, str(stop_file), kind],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    try:
        yield json.loads(process.stdout.readline())["url"], step_times
        stop_file.write_text("stop")
        step_times.extend(json.loads(process.stdout.readline())["times"])
    finally:
        process.kill()
        process.wait()
        stop_file.unlink(missing_ok=True)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def measure(endpoint: str, args: argparse.Namespace, spool: str) -> None:
    step_times: list[float] = []
    windows: list[tuple[str, float, float, list[float]]] = []
    served = daemon(spool) if endpoint == "daemon" else trainer(spool, endpoint, step_times)
    with served as (url, _):
        port = urllib.parse.urlsplit(url).port
        assert port is not None
        time.sleep(args.phase / 2)  # settle: the first spool writes and reads, the endpoint's imports
        for kind in PHASES:
            times: list[float] = []
            with load(kind, port):
                stop = threading.Event()
                scraper = threading.Thread(target=scrape_times, args=(url, stop, args.interval, times, kind == "crowd"))
                start = time.monotonic()
                scraper.start()
                time.sleep(args.phase)
                stop.set()
                scraper.join()
                windows.append((kind, start, time.monotonic(), times))
    print(f"{endpoint}:")
    for kind in dict.fromkeys(PHASES):
        times = [t for k, _, _, ts in windows if k == kind for t in ts]
        line = (
            f"  {kind:8s} scrape median {statistics.median(times) * 1e3:7.1f} ms"
            f"  p99 {percentile(times, 0.99) * 1e3:7.1f} ms  max {max(times) * 1e3:7.1f} ms  ({len(times)} scrapes)"
        )
        if step_times:
            rates = [sum(1 for t in step_times if s <= t < e) / (e - s) for _, s, e, _ in windows]
            ratios = [
                rates[i] / ((rates[i - 1] + rates[i + 1]) / 2) if kind != "idle" else rates[i]
                for i, (k, _, _, _) in enumerate(windows)
                if k == kind
            ]
            line += (
                f"; {statistics.median(ratios):.0f} steps/s"
                if kind == "idle"
                else f"; step rate / idle around it: {ratios[0]:.3f}"
            )
        print(line, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--phase", type=float, default=15.0, help="seconds per phase")
    parser.add_argument("--interval", type=float, default=0.6, help="seconds from one timed scrape to the next")
    parser.add_argument("--ranks", type=int, default=16, help="simulated ranks in the spool (200 series each)")
    parser.add_argument("--endpoints", default="daemon,job,rank")
    args = parser.parse_args()
    print(
        f"scrape latency under load: {args.phase:g} s phases, a timed scrape every {args.interval:g} s; "
        f"{args.ranks} simulated ranks x 200 series in the spool"
    )
    for endpoint in args.endpoints.split(","):
        with tempfile.TemporaryDirectory() as spool, spool_ranks(spool, args.ranks):
            measure(endpoint, args, spool)


if __name__ == "__main__":
    main()
