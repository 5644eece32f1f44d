"""A data-parallel training run on the CPU (torch.distributed with gloo, DistributedDataParallel), one process per
rank under torchrun, for the straggler measurements (``straggler_runs.py``). The exporter is attached from outside
(``neuron-exporter run``).

    torchrun --standalone --nproc-per-node 4 benchmarks/data_parallel_trainer.py --seconds 1800 [--slow-rank 2]

Each rank reads its batches from a DataLoader whose samples cost some CPU (in the training process: the time is
``data``), trains a small model whose gradients DDP averages over the ranks in ``backward()`` (the ranks wait for
each other there, in ``step``), and sleeps --device-seconds per step, where a real job would wait for its device.
Rank 0 saves a checkpoint (model, AdamW, scheduler, step) every --checkpoint-every steps. --slow-rank R makes rank
R's input --slow-seconds slower per batch: the straggler.
"""

from __future__ import annotations

import argparse
import io
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset


class Samples(Dataset):
    """Random samples that take some CPU to make, and ``delay`` seconds more per batch (on its first sample)."""

    def __init__(self, batch: int, delay: float):
        self.batch = batch
        self.delay = delay

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.delay and index % self.batch == 0:
            time.sleep(self.delay)
        x = torch.randn(64)
        for _ in range(4):
            x = torch.tanh(x @ torch.ones(64, 64) / 64 + x)
        return x, torch.tensor(index % 10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, required=True, help="how long to train")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--device-seconds", type=float, default=0.1, help="a stand-in for the device's step time")
    parser.add_argument("--checkpoint-every", type=int, default=200)
    parser.add_argument("--slow-rank", type=int, default=None)
    parser.add_argument("--slow-seconds", type=float, default=0.05)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    delay = args.slow_seconds if rank == args.slow_rank else 0.0
    loader = DataLoader(Samples(args.batch, delay), batch_size=args.batch)
    model = DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1000)
    end = time.monotonic() + args.seconds
    steps = 0
    for x, y in loader:
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        scheduler.step()
        time.sleep(args.device_seconds)
        steps += 1
        if rank == 0 and steps % args.checkpoint_every == 0:
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": steps}
            torch.save({**state, "scheduler": scheduler.state_dict()}, io.BytesIO())
        # Every rank stops at the same step: rank 0 decides, the others follow.
        if steps % 50 == 0:
            done = torch.tensor(float(rank == 0 and time.monotonic() > end))
            dist.broadcast(done, 0)
            if done.item():
                break
    print(f"rank {rank} ({os.getpid()}): {steps} steps", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
