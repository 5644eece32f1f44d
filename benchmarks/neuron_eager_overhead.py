"""What attach() costs per step of an eager training loop on TorchNeuron's ``neuron`` device (emulated on the CPU by
tests/support/torchneuron: torch 2.13+, e.g. .venv-torch-latest-3.12).

A small MLP trained with AdamW on the device, one ``.item()`` per step (the loss, as a logging loop reads it) and one
operator TorchNeuron runs on the CPU per step (``digamma``, counted per call), in blocks of steps, bare and with
neuron_exporter.attach() interleaved in one process, so machine noise hits both alike. Prints the median time per step
of each, their ratio, the median of the rounds' own ratios, the training thread's CPU time, and the device syncs of
each variant (attach() must add none).

    python benchmarks/neuron_eager_overhead.py [--rounds 30] [--steps 40] [--settle 10]

What this measures is the exporter's work per host read, per CPU-fallback call and per optimizer step; nothing of it
runs per operator on the device. The emulated device runs each operator through a Python kernel, tens of
microseconds, far slower than a real device's dispatch: the ratio is that of this loop, and the exporter's own
time per step (printed too) is what carries over.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support" / "torchneuron"))

import torch
import torch_neuronx
from torch_neuronx import _C

import neuron_exporter

ATTACH = {"port": 0, "addr": "127.0.0.1", "node_view": False}


def make_step():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)).to("neuron")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(32, 64).to("neuron"), torch.randint(0, 10, (32,)).to("neuron")
    losses = []

    def step():
        optimizer.zero_grad()
        logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits, y) + torch.digamma(logits.abs() + 1).mean() * 1e-3
        loss.backward()
        optimizer.step()
        losses.append(loss.item())

    return step


def run_block(step, steps: int) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds of the training thread) per step over one block, and the device syncs in it."""
    syncs = _C.syncs
    start, start_cpu = time.perf_counter(), time.thread_time()
    for _ in range(steps):
        step()
    return (time.perf_counter() - start) / steps, (time.thread_time() - start_cpu) / steps, _C.syncs - syncs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--steps", type=int, default=40, help="steps per block")
    parser.add_argument("--settle", type=int, default=10, help="untimed steps at the start of every block")
    args = parser.parse_args()
    torch.set_num_threads(1)
    step = make_step()
    run_block(step, 30)  # compile the eager kernels, warm the caches
    per_step: dict[str, list[float]] = {"bare": [], "attach()": []}
    cpu_per_step: dict[str, list[float]] = {"bare": [], "attach()": []}
    syncs = {"bare": 0, "attach()": 0}
    hook_seconds = 0.0
    for round_index in range(args.rounds):
        order = list(per_step) if round_index % 2 == 0 else list(reversed(per_step))
        for variant in order:
            if variant == "bare":
                run_block(step, args.settle)
                seconds, cpu, synced = run_block(step, args.steps)
            else:
                with neuron_exporter.attach(**ATTACH) as handle:
                    run_block(step, args.settle)
                    own = handle.stats.hook_seconds
                    seconds, cpu, synced = run_block(step, args.steps)
                    hook_seconds += handle.stats.hook_seconds - own
            per_step[variant].append(seconds)
            cpu_per_step[variant].append(cpu)
            syncs[variant] += synced
    bare, attached = (statistics.median(per_step[v]) for v in ("bare", "attach()"))
    paired = statistics.median(a / b for a, b in zip(per_step["attach()"], per_step["bare"], strict=True))
    bare_cpu, attached_cpu = (statistics.median(cpu_per_step[v]) for v in ("bare", "attach()"))
    print(
        f"eager loop on the emulated neuron device (torch {torch.__version__}, torch_neuronx "
        f"{torch_neuronx.__version__}), {args.rounds} rounds x {args.steps} steps per variant, interleaved:"
    )
    print(f"  bare       {bare * 1e6:9.1f} us/step")
    added = (attached - bare) * 1e6
    print(f"  attach()   {attached * 1e6:9.1f} us/step   x{attached / bare:.3f} ({added:+.1f} us/step)")
    print(f"  median of the rounds' own ratios x{paired:.3f}")
    print(f"  CPU time of the training thread: x{attached_cpu / bare_cpu:.3f}")
    print(f"  device syncs: bare {syncs['bare']}, attach() {syncs['attach()']} (must be equal)")
    own = hook_seconds / (args.rounds * args.steps) * 1e6
    print(f"  the exporter's own time in its host-read wrappers: {own:.2f} us/step")


if __name__ == "__main__":
    main()
