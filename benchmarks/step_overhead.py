"""What attach() costs per training step, next to the two ways torch_xla offers to watch a loop.

One small MLP training loop on the XLA CPU device, run in blocks of steps, in variants interleaved in one
process: with neuron_exporter.attach(); with met.metrics_report() read every step; with torch_xla's own
XLA_METRICS_FILE dump (the report appended to a file at every sync); and the same loop with one loss.item() per
step (a host read that cuts the graph) with attach(). Each block runs right before or after a block of its bare
loop (which first, at random), and the pairs run in a random order each round: the ratio of a pair sees the same
moment of the machine, and the order of blocks hits every variant alike.

attach() is measured in its steady state, as a job that trains for hours sees it: each attached block attaches,
runs --settle steps untimed (the server and spool threads start, the first steps claim the rank), then times
--steps steps, then detaches; its bare loop runs as many steps untimed first. The time attach() itself takes is
printed apart. The attached blocks serve their rank in process (``node_view=False``): with the default, each block
would start the node endpoint's own process (about 0.3 s of CPU, on the other core of a small machine) while it runs,
which a job pays once.

Prints, per variant, the median time per step and the median over rounds of its ratio to its bare block (with the
interquartile range of those ratios); then the exporter's own time on the training thread (its
step hook and host-read wrappers) per step, and the CPU time of its threads (HTTP server, spool writer) per step.

    PJRT_DEVICE=CPU python benchmarks/step_overhead.py [--rounds 120] [--steps 30] [--settle 100]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import threading
import time

import psutil
import torch

import torch_xla
import torch_xla.debug.metrics as met
import torch_xla.debug.metrics_saver as metrics_saver

import neuron_exporter

BARE, ATTACHED, REPORT, DUMP = "bare", "attach()", "metrics_report() every step", "XLA_METRICS_FILE dump"
BARE_READ, ATTACHED_READ = "bare, .item() per step", "attach(), .item() per step"
BARE_OF = {ATTACHED: BARE, REPORT: BARE, DUMP: BARE, ATTACHED_READ: BARE_READ}


def make_step(device, read_loss: bool = False):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 64).to(device), torch.randint(0, 10, (32,)).to(device)

    def step():
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        if read_loss:
            loss.item()
        torch_xla.sync()

    return step


def run_block(step, steps: int, after_step=None) -> float:
    """Seconds per step over one block."""
    start = time.perf_counter()
    for _ in range(steps):
        step()
        if after_step:
            after_step()
    return (time.perf_counter() - start) / steps


def exporter_threads_cpu_seconds() -> float:
    """CPU time used so far by the exporter's own threads (named neuron-exporter-*) in this process."""
    ids = {thread.native_id for thread in threading.enumerate() if thread.name.startswith("neuron-exporter")}
    return sum(t.user_time + t.system_time for t in psutil.Process().threads() if t.id in ids)


class Attached:
    """Totals over the attached blocks of one variant."""

    def __init__(self):
        self.steps = 0
        self.hook_seconds = 0.0
        self.thread_seconds = 0.0
        self.attach_seconds: list[float] = []


def run_attached(step, args, totals: Attached) -> float:
    start = time.perf_counter()
    handle = neuron_exporter.attach(port=0, addr="127.0.0.1", node_view=False)
    totals.attach_seconds.append(time.perf_counter() - start)
    try:
        run_block(step, args.settle)
        hook_before, threads_before = handle.stats.hook_seconds, exporter_threads_cpu_seconds()
        seconds = run_block(step, args.steps)
        totals.hook_seconds += handle.stats.hook_seconds - hook_before
        totals.thread_seconds += exporter_threads_cpu_seconds() - threads_before
        totals.steps += args.steps
    finally:
        handle.detach()
    return seconds


def quartiles(values: list[float]) -> tuple[float, float]:
    q = statistics.quantiles(values, n=4)
    return q[0], q[2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=120)
    parser.add_argument("--steps", type=int, default=30, help="timed steps per block")
    parser.add_argument("--settle", type=int, default=100, help="untimed steps after attach() in attached blocks")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    steps = {False: make_step(torch_xla.device()), True: make_step(torch_xla.device(), read_loss=True)}
    run_block(steps[False], 20)  # compile and warm the cache
    run_block(steps[True], 20)
    dump = os.path.join(tempfile.mkdtemp(), "metrics.txt")
    per_step: dict[str, list[float]] = {
        variant: [] for variant in (BARE, ATTACHED, REPORT, DUMP, BARE_READ, ATTACHED_READ)
    }
    ratios: dict[str, list[float]] = {variant: [] for variant in BARE_OF}
    attached = {ATTACHED: Attached(), ATTACHED_READ: Attached()}
    order = random.Random(args.seed)

    def run(variant: str) -> float:
        step = steps[variant in (BARE_READ, ATTACHED_READ)]
        if variant in attached:
            seconds = run_attached(step, args, attached[variant])
        elif variant == REPORT:
            seconds = run_block(step, args.steps, after_step=met.metrics_report)
        elif variant == DUMP:
            metrics_saver._TLS.metrics_file = dump  # what XLA_METRICS_FILE=<path> makes sync() use
            try:
                seconds = run_block(step, args.steps)
            finally:
                metrics_saver._TLS.metrics_file = None
            os.truncate(dump, 0)
        else:
            run_block(step, args.settle)  # as the attached blocks do
            seconds = run_block(step, args.steps)
        per_step[variant].append(seconds)
        return seconds

    for _ in range(args.rounds):
        for variant in order.sample(list(BARE_OF), len(BARE_OF)):
            pair = [variant, BARE_OF[variant]]
            order.shuffle(pair)
            seconds = dict(zip(pair, (run(pair[0]), run(pair[1])), strict=True))
            ratios[variant].append(seconds[variant] / seconds[BARE_OF[variant]])

    print(
        f"{args.rounds} rounds x {args.steps} timed steps per variant, each block next to a block of its bare loop "
        f"(attach() settled for {args.settle} steps first); median time per step, and the median ratio to the "
        f"bare block:"
    )
    for variant, times in per_step.items():
        line = f"  {variant:30s} {statistics.median(times) * 1e6:9.1f} us/step"
        if variant in BARE_OF:
            low, high = quartiles(ratios[variant])
            line += f"   x{statistics.median(ratios[variant]):.3f} (middle half of rounds x{low:.3f} to x{high:.3f})"
        print(line)
    for variant, totals in attached.items():
        print(
            f"  {variant}: the exporter's own time on the training thread "
            f"{totals.hook_seconds / totals.steps * 1e6:.2f} us/step; its threads' CPU time "
            f"{totals.thread_seconds / totals.steps * 1e6:.2f} us/step; "
            f"attach() itself {statistics.median(totals.attach_seconds) * 1e3:.1f} ms"
        )
    bare = statistics.median(per_step[BARE])
    # The end-to-end difference of attach() is often within the noise (even below bare); its own time is not.
    exporter = max(
        statistics.median(per_step[ATTACHED]) - bare, attached[ATTACHED].hook_seconds / attached[ATTACHED].steps
    )
    for variant in (REPORT, DUMP):
        cost = statistics.median(per_step[variant]) - bare
        print(f"  {variant} adds {cost * 1e6:.0f} us/step: {cost / exporter:.0f}x what attach() adds")


if __name__ == "__main__":
    main()
