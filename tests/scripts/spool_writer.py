"""Simulated training ranks for the spool and node-endpoint tests and the daemon benchmark.

Writes one spool file per rank, each the exposition of a real prometheus_client registry shaped like a rank's
(steps, step-duration histogram, compile counters, N fallback operators, generic counters), then keeps its rank
locks (the ranks are alive) until stdin closes or the process is killed. Prints "ready" once every file is written.

    spool_writer.py SPOOL_DIR RANKS [--steps N] [--ops N] [--last-step-age SECONDS] [--finished] [--rewrite SECONDS]
                    [--diagnosis-bytes N]

RANKS is a comma list ("0,1,5") or a range ("0-31"). --rewrite keeps rewriting the files
(steps + 1 each time) every SECONDS, like a training rank's spool thread. --diagnosis-bytes writes each rank's
diagnosis too, a valid document of about N bytes.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)

from neuron_exporter import run_identity
from neuron_exporter.node.spool_format import RankMeta
from neuron_exporter.node.spool_writer import write_rank_file
from tests.support.diagnosis_documents import sized_rank_document

LABELS = ["run_id", "rank", "local_rank"]


def rank_exposition(rank: str, steps: int, ops: int, run_id: str | None = None) -> bytes:
    registry = CollectorRegistry()
    ids = (run_id or run_identity.run_id(), rank, rank)
    Counter("xla_steps", "Steps ended", LABELS, registry=registry).labels(*ids).inc(steps)
    duration = Histogram(
        "xla_step_duration_seconds",
        "Wall time between step ends",
        LABELS,
        registry=registry,
        buckets=(0.01, 0.1, 1.0, 10.0),
    )
    for _ in range(min(steps, 5)):
        duration.labels(*ids).observe(0.05)
    Counter("xla_compilations", "Compiler runs", LABELS, registry=registry).labels(*ids).inc(2)
    Counter("xla_graph_executions", "Graph executions", LABELS, registry=registry).labels(*ids).inc(steps)
    fallback = Counter("xla_cpu_fallback_ops", "Operators run on the CPU", LABELS + ["op"], registry=registry)
    for i in range(ops):
        fallback.labels(*ids, f"aten::op_{i}").inc(steps)
    generic = Counter("xla_events", "Every other torch_xla counter", LABELS + ["counter"], registry=registry)
    for name in (
        "MarkStep",
        "CachedCompile",
        "UncachedCompile",
        "CreateXlaTensor",
        "DestroyXlaTensor",
        "ExecuteComputation",
        "DeviceDataCacheMiss",
        "CreateDataHandles",
        "RegisterXLAFunctions",
    ):
        generic.labels(*ids, name).inc(steps)
    timed = Counter("xla_metric_seconds", "Every torch_xla time metric", LABELS + ["metric"], registry=registry)
    for name in ("CompileTime", "ExecuteTime", "LazyTracing", "TransferToDeviceTime", "DeviceLockWait"):
        timed.labels(*ids, name).inc(0.001 * steps)
    Gauge("xla_process_resident_memory_bytes", "Resident memory", LABELS, registry=registry).labels(*ids).set(1e9)
    return generate_latest(registry)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("spool_dir")
    parser.add_argument("ranks")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--ops", type=int, default=2)
    parser.add_argument("--last-step-age", type=float, default=None)
    parser.add_argument("--finished", action="store_true")
    parser.add_argument("--rewrite", type=float, default=None)
    parser.add_argument("--diagnosis-bytes", type=int, default=None)
    args = parser.parse_args()
    disable_created_metrics()  # like the rank collectors, which export no _created series
    if "-" in args.ranks:
        first, last = args.ranks.split("-")
        ranks = [str(r) for r in range(int(first), int(last) + 1)]
    else:
        ranks = args.ranks.split(",")

    # Rewrites change every value that counts steps, as a training rank's do, without building the registry again
    # (which would cost the machine more than the ranks' spool threads do).
    expositions = {rank: rank_exposition(rank, args.steps, args.ops) for rank in ranks}
    counted = f" {float(args.steps)!r}\n".encode()
    run = run_identity.run_id()
    diagnoses = {
        rank: json.dumps({"format": 1, "ranks": [sized_rank_document(rank, run, args.diagnosis_bytes)]}).encode()
        for rank in ranks
        if args.diagnosis_bytes is not None
    }

    def write_all(steps: int) -> None:
        for rank in ranks:
            last_step = None if args.last_step_age is None else time.time() - args.last_step_age
            meta = RankMeta.current(rank, rank, finished=args.finished, last_step_time=last_step)
            exposition = expositions[rank]
            if steps != args.steps:
                exposition = exposition.replace(counted, f" {float(steps)!r}\n".encode())
            write_rank_file(args.spool_dir, meta, exposition, diagnosis=diagnoses.get(rank))

    write_all(args.steps)
    print("ready", flush=True)
    if args.rewrite is not None:

        def rewrite():
            steps = args.steps
            while True:
                time.sleep(args.rewrite)
                steps += 1
                try:
                    write_all(steps)
                except OSError:
                    pass  # the directory was deleted mid-write: the next write makes it again

        threading.Thread(target=rewrite, daemon=True).start()
    sys.stdin.read()


if __name__ == "__main__":
    main()
