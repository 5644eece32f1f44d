"""Whether a stock Prometheus scrapes the node daemon within its default timeout (10 s) when the spool holds the
costliest files a local user can lay: --files rank files of --file-bytes each, every one a valid exposition of as many
short series as fit (tests/support/rank_files.hostile_rank_file), so that the daemon checks and serves as much as its
budget lets it, and Prometheus ingests all of it.

The daemon runs with its default budget (or --max-total-bytes); Prometheus (2.42, installed) scrapes it every
--interval seconds with the default timeout. Prints the daemon's first (cold) scrape as Prometheus saw it, the next
ones, ``up`` and the samples per scrape.

    python benchmarks/spool_budget.py [--files 20] [--file-bytes 4194304] [--max-total-bytes N] [--scrapes 3]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from neuron_exporter.config import Options  # noqa: E402
from tests.support.daemon import Daemon  # noqa: E402
from tests.support.prometheus import running_prometheus  # noqa: E402
from tests.support.rank_files import hostile_rank_file, rank_file  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=20)
    parser.add_argument("--file-bytes", type=int, default=4 * 1024 * 1024)
    parser.add_argument("--max-total-bytes", type=int, default=None, help="default: the option's default")
    parser.add_argument("--scrapes", type=int, default=3)
    parser.add_argument("--interval", type=float, default=12.0, help="seconds between scrapes (more than 10)")
    args = parser.parse_args()
    budget = args.max_total_bytes or Options().spool_max_total_bytes

    with tempfile.TemporaryDirectory() as work:
        spool = Path(work) / "spool"
        spool.mkdir(mode=0o700)
        for rank in range(args.files):
            rank_file(spool, str(rank)).write_bytes(hostile_rank_file(str(rank), args.file_bytes))
        daemon = Daemon(
            Path(work),
            *["--addr", "127.0.0.1", "--port", "0", "--spool-dir", str(spool)],
            env={"NEURON_EXPORTER_SPOOL_MAX_TOTAL_BYTES": str(budget)},
        )
        config = {
            "global": {"scrape_interval": f"{args.interval:g}s"},  # the timeout is Prometheus' default, 10 s
            "scrape_configs": [{"job_name": "neuron-exporter", "static_configs": [{"targets": [daemon.url[7:-8]]}]}],
        }
        seen: list[tuple[float, float, float]] = []
        try:
            with running_prometheus(config, Path(work)) as prometheus:
                deadline = time.monotonic() + args.interval * (args.scrapes + 3) + 60
                while len(seen) < args.scrapes and time.monotonic() < deadline:
                    time.sleep(args.interval / 3)
                    result = prometheus.query("up[10m]")["data"]["result"]
                    ups = result[0]["values"] if result else []
                    durations = prometheus.query("scrape_duration_seconds[10m]")["data"]["result"]
                    samples = prometheus.query("scrape_samples_scraped[10m]")["data"]["result"]
                    seen = [
                        (float(u[1]), float(d[1]), float(s[1]))
                        for u, d, s in zip(
                            ups,
                            durations[0]["values"] if durations else [],
                            samples[0]["values"] if samples else [],
                            strict=False,
                        )
                    ]
        finally:
            daemon.stop()
    print(
        f"spool: {args.files} files x {args.file_bytes} bytes of short series; daemon budget "
        f"{budget} bytes; Prometheus scrapes every {args.interval:g} s, timeout 10 s"
    )
    for n, (up, duration, samples) in enumerate(seen, start=1):
        print(f"  scrape {n}{' (cold)' if n == 1 else '       '}: up {up:g}  {duration:6.2f} s  {samples:9.0f} samples")


if __name__ == "__main__":
    main()
