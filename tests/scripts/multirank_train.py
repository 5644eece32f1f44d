"""One rank of a multi-rank training run with attach(), steered by files in a control directory.

    torchrun --nproc-per-node 2 multirank_train.py CONTROL_DIR --steps 4,7 [--forever] [--after N]

Each rank (RANK from the launcher) attaches with the NEURON_EXPORTER_* settings of its environment, writes
CONTROL_DIR/pid-<rank>, runs its number of steps from --steps (one per rank), then writes
CONTROL_DIR/stepped-<rank>. Then it waits for CONTROL_DIR/release, stepping all the while with --forever,
runs --after more steps, prints {"rank", "steps"} as JSON and detaches.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

import torch_xla

import neuron_exporter


def touch(path: Path, text: str = "") -> None:
    temp = path.with_suffix(".tmp")
    temp.write_text(text)
    os.replace(temp, path)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("control", type=Path)
    parser.add_argument("--steps", required=True, help="steps of each rank, comma separated")
    parser.add_argument("--forever", action="store_true", help="keep stepping until released")
    parser.add_argument("--after", type=int, default=0, help="steps to run after the release")
    args = parser.parse_args()
    rank = int(os.environ.get("RANK", "0"))
    steps = int(args.steps.split(",")[rank])

    neuron_exporter.attach()
    touch(args.control / f"pid-{rank}", str(os.getpid()))
    device = torch_xla.device()
    torch.manual_seed(rank)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(8, 16).to(device), torch.randint(0, 4, (8,)).to(device)
    done = 0

    def step() -> None:
        nonlocal done
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        torch_xla.sync()
        done += 1

    for _ in range(steps):
        step()
    touch(args.control / f"stepped-{rank}")
    release = args.control / "release"
    while not release.exists():
        if args.forever:
            step()
        time.sleep(0.05)  # a slow loop: the machine has two cores for two ranks and the daemon
    for _ in range(args.after):
        step()
    print(json.dumps({"rank": rank, "steps": done}), flush=True)
    neuron_exporter.detach()


if __name__ == "__main__":
    main()
