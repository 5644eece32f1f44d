"""What attach() costs per training step, next to the two ways torch_xla offers to watch a loop.

One small MLP training loop on the XLA CPU device, run in blocks of steps, in variants interleaved in one
process (so machine noise hits them all alike): bare; with neuron_exporter.attach(); with
met.metrics_report() read every step; with torch_xla's own XLA_METRICS_FILE dump (the report appended to a
file at every sync); and the same loop with one loss.item() per step (a host read that cuts the graph), bare and
with attach(). Prints each variant's median time per step and its ratio to its bare loop, and the exporter's own
time on the training thread (its step hook and host-read wrappers), per step.

    PJRT_DEVICE=CPU python benchmarks/step_overhead.py [--rounds 15] [--steps 60]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch

import torch_xla
import torch_xla.debug.metrics as met
import torch_xla.debug.metrics_saver as metrics_saver

import neuron_exporter


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=60, help="steps per block")
    args = parser.parse_args()

    step = make_step(torch_xla.device())
    item_step = make_step(torch_xla.device(), read_loss=True)
    run_block(step, 20)  # compile and warm the cache
    run_block(item_step, 20)
    dump = os.path.join(tempfile.mkdtemp(), "metrics.txt")
    per_step: dict[str, list[float]] = {"bare": [], "attach()": [], "metrics_report() every step": [],
                                        "XLA_METRICS_FILE dump": [], "bare, .item() per step": [],
                                        "attach(), .item() per step": []}
    hook = {"attach()": [0.0, 0], "attach(), .item() per step": [0.0, 0]}  # exporter seconds, steps

    for round_index in range(args.rounds):
        order = list(per_step)
        order = order[round_index % len(order):] + order[:round_index % len(order)]  # rotate who goes first
        for variant in order:
            if variant in ("bare", "bare, .item() per step"):
                seconds = run_block(step if variant == "bare" else item_step, args.steps)
            elif variant in hook:
                with neuron_exporter.attach(port=0, addr="127.0.0.1") as handle:
                    seconds = run_block(step if variant == "attach()" else item_step, args.steps)
                    hook[variant][0] += handle.stats.hook_seconds
                    hook[variant][1] += args.steps
            elif variant == "metrics_report() every step":
                seconds = run_block(step, args.steps, after_step=met.metrics_report)
            else:
                metrics_saver._TLS.metrics_file = dump  # what XLA_METRICS_FILE=<path> makes sync() use
                try:
                    seconds = run_block(step, args.steps)
                finally:
                    metrics_saver._TLS.metrics_file = None
                os.truncate(dump, 0)
            per_step[variant].append(seconds)

    medians = {variant: statistics.median(times) for variant, times in per_step.items()}
    print(f"{args.rounds} rounds x {args.steps} steps per variant, interleaved; median time per step:")
    for variant, median in medians.items():
        bare = medians["bare, .item() per step" if ".item()" in variant else "bare"]
        print(f"  {variant:30s} {median * 1e6:9.1f} us/step   x{median / bare:.3f} of its bare loop")
    for variant, (seconds, steps) in hook.items():
        print(f"  {variant}: the exporter's own time on the training thread {seconds / steps * 1e6:.2f} us per step")
    # The end-to-end difference of attach() is often within the noise (even below bare); its own time is not.
    exporter = max(medians["attach()"] - medians["bare"], hook["attach()"][0] / hook["attach()"][1])
    for variant in ("metrics_report() every step", "XLA_METRICS_FILE dump"):
        cost = medians[variant] - medians["bare"]
        print(f"  {variant} adds {cost * 1e6:.0f} us/step: {cost / exporter:.0f}x what attach() adds")


if __name__ == "__main__":
    main()
