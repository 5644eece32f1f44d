"""A data-parallel training run on the CPU (torch.distributed with gloo, DistributedDataParallel) with no line of the
exporter's: run it under ``neuron-exporter run -- torchrun --max-restarts 1`` and the exporter sees its restarts, the
work they cost, and the rank that holds the others back (``make demo`` does).

    neuron-exporter run -- torchrun --standalone --nproc-per-node 4 --max-restarts 1 examples/data_parallel.py \\
        --checkpoint /tmp/checkpoint.pt --slow-rank 1 --die-rank 2

Rank 0 saves a checkpoint (model, AdamW, LR scheduler, step) every --checkpoint-every steps, and every rank resumes
from the last one. --slow-rank R reads its batches --slow-seconds slower: every other rank waits for it at each
step's gradient all-reduce. --die-rank R dies at --die-step of the first attempt, as a device error would end it;
torchrun then stops the other ranks and starts all four again.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset


class Samples(Dataset):
    """Random sequences of 32 token ids and a label, ``delay`` seconds slower per batch."""

    def __init__(self, batch: int, delay: float):
        self.batch, self.delay = batch, delay

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, index: int):
        if self.delay and index % self.batch == 0:
            time.sleep(self.delay)
        return torch.randint(0, 1024, (32,)), torch.tensor(index % 10)


class Classifier(torch.nn.Module):
    """Token embeddings, a hidden layer over each token, averaged, and the class."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = torch.nn.Embedding(1024, 64)
        self.hidden = torch.nn.Linear(64, 256)
        self.out = torch.nn.Linear(256, 10)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.hidden(self.embedding(ids))).mean(dim=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--checkpoint-every", type=int, default=50)
    parser.add_argument("--device-seconds", type=float, default=0.05, help="a stand-in for the device's step")
    parser.add_argument("--slow-rank", type=int, default=None)
    parser.add_argument("--slow-seconds", type=float, default=0.05)
    parser.add_argument("--die-rank", type=int, default=None)
    parser.add_argument("--die-step", type=int, default=120)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = DistributedDataParallel(Classifier())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1000)
    step = 0
    if args.checkpoint.exists():
        state = torch.load(args.checkpoint, weights_only=False)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        step = state["step"]
        print(f"rank {rank}: attempt {attempt} resumes from step {step}", flush=True)
    delay = args.slow_seconds if rank == args.slow_rank else 0.0
    batches = iter(DataLoader(Samples(16, delay), batch_size=16))
    while step < args.steps:
        x, y = next(batches)
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        time.sleep(args.device_seconds)
        optimizer.step()
        scheduler.step()
        step += 1
        if attempt == 0 and rank == args.die_rank and step == args.die_step:
            print(f"rank {rank}: dies at step {step}", flush=True)
            os._exit(3)
        if rank == 0 and step % args.checkpoint_every == 0:
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
            torch.save({**state, "scheduler": scheduler.state_dict()}, args.checkpoint.with_suffix(".tmp"))
            os.replace(args.checkpoint.with_suffix(".tmp"), args.checkpoint)
        dist.barrier()  # every rank resumes from the same checkpoint
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
