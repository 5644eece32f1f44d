"""What attach() costs per step of a training loop compiled with torch.compile.

A small MLP whose forward pass is compiled with torch.compile, trained with SGD, in blocks of steps, bare and with
neuron_exporter.attach() interleaved in one process (so machine noise hits both alike), on two setups: the
inductor backend on the CPU (what a GPU or TorchNeuron loop looks like to the exporter: optimizer steps and no
torch_xla step marker), and torch_xla's openxla backend on the XLA CPU device (with torch_xla.sync() every step).
Prints, per setup, the median time per step of each variant and their ratio, the median of each round's own
ratio and the ratio of the fastest blocks (on a busy machine the blocks vary by tens of percent, far more than
what attach() adds: read the three together), the exporter's own time in its optimizer-step hooks, and checks
that the attached blocks compiled nothing more than the bare ones (torch's own compilation records).

    PJRT_DEVICE=CPU python benchmarks/compile_overhead.py [--rounds 60] [--steps 40] [--setups inductor,openxla]

Every block runs --settle steps untimed first (attached: while the threads attach() starts come up), so the timed
steps are the steady state a long job sees. Without torch_xla installed (torch's newest releases), only the inductor
setup runs. The attached blocks serve their
rank in process (``node_view=False``): starting a node endpoint process at every block would measure that start,
which a job pays once.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import time

import torch
from torch._dynamo.utils import get_compilation_metrics

import neuron_exporter

HAS_XLA = importlib.util.find_spec("torch_xla") is not None
ATTACH = {"port": 0, "addr": "127.0.0.1", "node_view": False}


def make_step(backend: str):
    if backend == "openxla":
        import torch_xla

    device = torch_xla.device() if backend == "openxla" else torch.device("cpu")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)).to(device)
    compiled = torch.compile(model, backend=backend)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 64).to(device), torch.randint(0, 10, (32,)).to(device)

    def step():
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(compiled(x), y)
        loss.backward()
        optimizer.step()
        if backend == "openxla":
            torch_xla.sync()

    return step


def run_block(step, steps: int) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the training thread) per step over one block; the CPU time leaves out the
    time the thread waited for a core, which other processes of a busy machine take."""
    start, start_cpu = time.perf_counter(), time.thread_time()
    for _ in range(steps):
        step()
    return (time.perf_counter() - start) / steps, (time.thread_time() - start_cpu) / steps


def compilations() -> int:
    return sum(1 for record in get_compilation_metrics() if not record.is_runtime)


def measure(backend: str, rounds: int, steps: int, settle: int) -> None:
    torch.set_num_threads(1)  # the CPU kernels on one thread: less noise from a busy machine
    step = make_step(backend)
    run_block(step, 30)  # compile, and warm the caches
    with neuron_exporter.attach(**ATTACH):
        run_block(step, 30)
    before = compilations()
    per_step: dict[str, list[float]] = {"bare": [], "attach()": []}
    cpu_per_step: dict[str, list[float]] = {"bare": [], "attach()": []}
    hook_seconds = 0.0  # the exporter's own time in its step hook and host-read wrappers, attached blocks
    for round_index in range(rounds):
        order = list(per_step) if round_index % 2 == 0 else list(reversed(per_step))  # who goes first alternates
        for variant in order:
            if variant == "bare":
                run_block(step, settle)
                seconds, cpu = run_block(step, steps)
            else:
                with neuron_exporter.attach(**ATTACH) as handle:
                    run_block(step, settle)  # the threads attach() starts come up; the first step claims the rank
                    seconds, cpu = run_block(step, steps)
                    hook_seconds += handle.stats.hook_seconds
            per_step[variant].append(seconds)
            cpu_per_step[variant].append(cpu)
    compiled_since = compilations() - before
    with neuron_exporter.attach(**ATTACH):
        own = hooks_per_step()
    bare, attached = (statistics.median(per_step[v]) for v in ("bare", "attach()"))
    paired = statistics.median(a / b for a, b in zip(per_step["attach()"], per_step["bare"], strict=True))
    fastest = min(per_step["attach()"]) / min(per_step["bare"])  # the blocks least disturbed by the machine
    print(
        f"{backend} ({'XLA CPU device' if backend == 'openxla' else 'CPU'}, one intra-op thread): {rounds} rounds "
        f"x {steps} steps per variant, interleaved; median time per step:"
    )
    print(f"  bare       {bare * 1e6:9.1f} us/step")
    print(
        f"  attach()   {attached * 1e6:9.1f} us/step   x{attached / bare:.3f} of bare "
        f"({(attached - bare) * 1e6:+.1f} us/step)"
    )
    print(
        f"  median of the rounds' own ratios x{paired:.3f}; fastest block attached / fastest block bare x{fastest:.3f}"
    )
    bare_cpu, attached_cpu = (statistics.median(cpu_per_step[v]) for v in ("bare", "attach()"))
    print(
        f"  CPU time of the training thread: bare {bare_cpu * 1e6:.1f} us/step, attach() {attached_cpu * 1e6:.1f} "
        f"us/step, x{attached_cpu / bare_cpu:.3f}"
    )
    print(
        f"  the exporter's own time on the training thread: {hook_seconds / (rounds * steps) * 1e6:.2f} us/step in "
        f"its step hook and host-read wrappers (torch_xla step markers), {own * 1e6:.2f} us/step in its "
        f"optimizer-step hooks (step counting, and the check for new compilation records)"
    )
    print(f"  compilations while measuring: {compiled_since} (attach() must add none)")


def hooks_per_step(calls: int = 100_000) -> float:
    """Seconds per call of every global optimizer-step post hook (attach() adds its own two)."""
    from torch.optim.optimizer import _global_optimizer_post_hooks

    hooks = list(_global_optimizer_post_hooks.values())
    start = time.perf_counter()
    for _ in range(calls):
        for hook in hooks:
            hook(None, (), {})
    return (time.perf_counter() - start) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--steps", type=int, default=40, help="steps per block")
    parser.add_argument("--settle", type=int, default=20, help="untimed steps at the start of every block")
    parser.add_argument(
        "--setups",
        default="inductor,openxla" if HAS_XLA else "inductor",
        help="torch.compile backends, comma-separated",
    )
    args = parser.parse_args()
    backends = args.setups.split(",")
    if len(backends) == 1:
        measure(backends[0], args.rounds, args.steps, args.settle)
        return
    for backend in backends:  # one process each: the XLA device must exist before the first backward pass
        subprocess.run(
            [
                sys.executable,
                __file__,
                "--rounds",
                str(args.rounds),
                "--steps",
                str(args.steps),
                "--settle",
                str(args.settle),
                "--setups",
                backend,
            ],
            check=True,
        )


if __name__ == "__main__":
    main()
