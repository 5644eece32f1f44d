"""A small training loop on the XLA device with neuron-exporter attached, in four phases that each show one problem.

    PJRT_DEVICE=CPU python examples/train.py [--port 19478] [--linger 0]

1. clean:     one graph per step, compiled once, then served from the cache;
2. item:      loss.item() before the step ends: the graph is cut in two, plus a device-to-host read;
3. fallback:  torch.lgamma, which has no XLA lowering: it runs on the CPU (aten::lgamma, aten::digamma);
4. shapes:    the batch size changes every step: the compiler runs again at every step.
After each phase it prints what the exporter saw, read from its own /metrics like Prometheus would, and where the
training thread's time went in it: the goodput (the share in training steps) and each other phase's share. With
--continue-for, it then keeps training slowly with both of the last two problems, so that their alerts keep firing.
"""

from __future__ import annotations

import argparse
import time
import urllib.request

import torch
from prometheus_client.parser import text_string_to_metric_families

import torch_xla

import neuron_exporter

PHASES = (("clean", 20), ("item", 10), ("fallback", 10), ("shapes", 8))
# After the phases: two steps a second with the CPU fallback, every fourth of them with a batch size not seen
# before. Recompilations stay above the alert's 0.1 per step, and the machine stays nearly idle.
CONTINUE_STEP_SECONDS = 0.5
NEW_SHAPE_EVERY = 4


def read(url: str, run_id: str) -> dict[str, float]:
    """This run's series summed over labels, plus one entry per fallback op (the endpoint on a node's port serves
    every run of the machine)."""
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(urllib.request.urlopen(url, timeout=10).read().decode()):
        for sample in family.samples:
            if sample.labels.get("run_id") != run_id:
                continue
            key = sample.name
            if sample.name == "xla_cpu_fallback_ops_total":
                key = sample.labels["op"]
            elif sample.name == "training_time_seconds_total":
                key = "time:" + sample.labels["phase"]
            totals[key] = totals.get(key, 0) + sample.value
    return totals


BADPUT = ("compile", "host_sync", "data", "checkpoint", "startup", "other")


def goodput_line(delta: dict[str, float]) -> str:
    """``goodput 0.41 | compile 33% host_sync 18% ...`` from the change of training_time_seconds_total."""
    whole = sum(delta.get(f"time:{phase}", 0) for phase in ("step", *BADPUT)) or 1
    shares = " ".join(f"{phase} {delta.get(f'time:{phase}', 0) / whole:.0%}" for phase in BADPUT)
    return f"goodput {delta.get('time:step', 0) / whole:.2f} | {shares}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=19478)
    parser.add_argument("--addr", default="127.0.0.1")
    parser.add_argument(
        "--continue-for",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="after the four phases, keep training for this long, two steps a second, with the CPU fallback "
        "and a new batch size every fourth step, so that a scraper sees the counters move",
    )
    args = parser.parse_args()

    handle = neuron_exporter.attach(port=args.port, addr=args.addr)
    print(f"neuron-exporter: metrics at {handle.url}", flush=True)
    device = torch_xla.device()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def step(batch: int, item: bool = False, fallback: bool = False) -> None:
        x, y = torch.randn(batch, 64).to(device), torch.randint(0, 10, (batch,)).to(device)
        optimizer.zero_grad()
        out = model(x)
        if fallback:
            out = out + 0.01 * torch.lgamma(out.abs() + 1)
        loss = torch.nn.functional.cross_entropy(out, y)
        loss.backward()
        optimizer.step()
        if item:
            loss.item()
        torch_xla.sync()

    def run(phase: str, steps: int) -> None:
        for i in range(steps):
            step(32 + i if phase == "shapes" else 32, item=phase == "item", fallback=phase == "fallback")

    before = read(handle.url, handle.run_id)
    for phase, steps in PHASES:
        run(phase, steps)
        after = read(handle.url, handle.run_id)
        delta = {key: after.get(key, 0) - before.get(key, 0) for key in after}
        ran = delta.get("xla_steps_total", 0) or 1
        fallbacks = ", ".join(f"{op} x{n:.0f}" for op, n in sorted(delta.items()) if op.startswith("aten::") and n)
        print(
            f"phase {phase:9s} steps {delta.get('xla_steps_total', 0):3.0f}"
            f" | graphs/step {delta.get('xla_graphs_per_step_sum', 0) / ran:4.1f}"
            f" | fragmented {delta.get('xla_fragmented_steps_total', 0):3.0f}"
            f" | compiles {delta.get('xla_compilations_total', 0):3.0f}"
            f" (recompiles {delta.get('xla_recompilations_total', 0):.0f})"
            f" | host reads {delta.get('xla_device_to_host_transfers_total', 0):3.0f}"
            f" | CPU fallback: {fallbacks or 'none'}\n"
            f"          {goodput_line(delta)}",
            flush=True,
        )
        before = after
    if args.continue_for > 0:
        print(
            "then: two steps a second with the CPU fallback, every fourth with a new batch size, "
            + ("until stopped" if args.continue_for == float("inf") else f"for {args.continue_for:g} s"),
            flush=True,
        )
    deadline = time.monotonic() + args.continue_for
    batch = 32 + PHASES[-1][1]  # past the sizes of the shapes phase
    steps = 0
    while time.monotonic() < deadline:
        steps += 1
        if steps % NEW_SHAPE_EVERY == 0:
            batch += 1
        step(batch, fallback=True)
        time.sleep(CONTINUE_STEP_SECONDS)
    neuron_exporter.detach()


if __name__ == "__main__":
    main()
