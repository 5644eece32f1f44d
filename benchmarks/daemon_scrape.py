"""What the node daemon costs to scrape: 128 simulated ranks, each with 200 fallback-operator series.

The ranks are one process that writes 128 spool files, each the exposition of a real prometheus_client registry
shaped like a rank's (tests/scripts/spool_writer.py), and keeps them alive; with --rewrite, it rewrites them every
that many seconds, as training ranks do (every 2 s by default). The daemon is
`neuron-exporter serve` in its own process. The script scrapes it over HTTP on one kept-alive connection, as
Prometheus does, plain and with gzip (Prometheus asks for gzip), and prints the median and p99 scrape time,
the size of a scrape, and the daemon's resident memory.

Scrapes come every --interval seconds (0.6), under the two renders a second an endpoint makes past its burst, so the
times are those of serving a scrape, not of waiting for a turn.

With --diagnosis-bytes N, every rank also writes a diagnosis of about N bytes, and the script then asks for the
merged /diagnosis page (JSON and text, a query string defeating any cache) and prints its size, the time to answer
it and the daemon's peak resident memory (64 ranks x 950000 bytes: the worst a node's ranks can write).

    python benchmarks/daemon_scrape.py [--ranks 128] [--ops 200] [--scrapes 100] [--interval 0.6] [--rewrite S]
                                       [--diagnosis-bytes N] [--pages 10]
"""

from __future__ import annotations

import argparse
import http.client
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
WRITER = ROOT / "tests" / "scripts" / "spool_writer.py"


def wait_for(predicate, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while not (result := predicate()):
        if time.monotonic() > deadline:
            raise SystemExit("timed out waiting for the daemon")
        time.sleep(0.05)
    return result


def scrape_times(port: int, scrapes: int, gzip: bool, interval: float) -> tuple[list[float], int]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    headers = {"Accept-Encoding": "gzip"} if gzip else {}
    times, size = [], 0
    next_time = time.perf_counter()
    for i in range(scrapes + 5):
        next_time += interval
        time.sleep(max(0.0, next_time - time.perf_counter()))
        start = time.perf_counter()
        connection.request("GET", "/metrics", headers=headers)
        response = connection.getresponse()
        body = response.read()
        elapsed = time.perf_counter() - start
        assert response.status == 200, response.status
        if i >= 5:  # the first scrapes warm up the daemon's imports and caches
            times.append(elapsed)
        size = len(body)
    connection.close()
    return times, size


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=128)
    parser.add_argument("--ops", type=int, default=200)
    parser.add_argument("--scrapes", type=int, default=100)
    parser.add_argument("--interval", type=float, default=0.6, help="seconds from one scrape to the next")
    parser.add_argument("--rewrite", type=float, default=None, help="rewrite every rank file every SECONDS")
    parser.add_argument("--diagnosis-bytes", type=int, default=None, help="each rank's diagnosis, about N bytes")
    parser.add_argument("--pages", type=int, default=10, help="/diagnosis pages asked for, each way")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as spool:
        rewrite = ["--rewrite", str(args.rewrite)] if args.rewrite else []
        if args.diagnosis_bytes:
            rewrite += ["--diagnosis-bytes", str(args.diagnosis_bytes)]
        command = [
            sys.executable,
            str(WRITER),
            spool,
            f"0-{args.ranks - 1}",
            "--ops",
            str(args.ops),
            "--steps",
            "1000",
            *rewrite,
        ]
        ranks = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert ranks.stdout.readline().strip() == "ready"
        log = Path(spool).parent / f"neuron-exporter-bench-{ranks.pid}.log"
        with open(log, "w") as out:
            daemon = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "neuron_exporter",
                    "serve",
                    "--addr",
                    "127.0.0.1",
                    "--port",
                    "0",
                    "--spool-dir",
                    spool,
                ],
                cwd=ROOT,
                stderr=out,
            )
        try:
            port = int(wait_for(lambda: re.search(r"listening on http://[^:]+:(\d+)", log.read_text())).group(1))
            rss_idle = psutil.Process(daemon.pid).memory_info().rss
            plain, plain_size = scrape_times(port, args.scrapes, False, args.interval)
            gzipped, gzip_size = scrape_times(port, args.scrapes, True, args.interval)
            rss = psutil.Process(daemon.pid).memory_info().rss
            pages = diagnosis_pages(port, args.pages) if args.diagnosis_bytes else None
            peak = peak_rss(daemon.pid)
        finally:
            daemon.terminate()
            daemon.wait()
            ranks.stdin.close()
            ranks.wait()
            log.unlink(missing_ok=True)

    rewritten = f", rewritten every {args.rewrite:g} s" if args.rewrite else ""
    print(
        f"node daemon: {args.ranks} ranks x {args.ops} fallback-operator series{rewritten}, {args.scrapes} scrapes "
        "each way"
    )
    for name, times, size in (("plain", plain, plain_size), ("gzip", gzipped, gzip_size)):
        print(
            f"  {name:5s}  median {statistics.median(times) * 1e3:7.2f} ms"
            f"   p99 {percentile(times, 0.99) * 1e3:7.2f} ms   {size / 1024:8.1f} KiB per scrape"
        )
    print(f"  daemon resident memory: {rss / 2**20:.1f} MiB after the scrapes ({rss_idle / 2**20:.1f} MiB before)")
    if pages is not None:
        print(f"  /diagnosis, {args.ranks} ranks x {args.diagnosis_bytes} bytes of diagnosis:")
        for name, (times, size) in pages.items():
            print(
                f"    {name:5s}  median {statistics.median(times):6.2f} s   max {max(times):6.2f} s"
                f"   {size / 2**20:6.2f} MiB"
            )
    print(f"  daemon peak resident memory: {peak / 2**20:.1f} MiB")


def diagnosis_pages(port: int, count: int) -> dict[str, tuple[list[float], int]]:
    """{json, text: (seconds per page, size of the last)}, each page asked for with a new query string."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    found = {}
    for name, query in (("json", "format=json&"), ("text", "")):
        times, size = [], 0
        for i in range(count):
            start = time.perf_counter()
            connection.request("GET", f"/diagnosis?{query}n={i}")
            response = connection.getresponse()
            body = response.read()
            times.append(time.perf_counter() - start)
            assert response.status == 200, response.status
            size = len(body)
        found[name] = (times, size)
    connection.close()
    return found


def peak_rss(pid: int) -> int:
    """The process's peak resident memory (VmHWM), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


if __name__ == "__main__":
    main()
