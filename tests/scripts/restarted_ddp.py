"""A data-parallel run (gloo on the CPU, DistributedDataParallel) under ``torchrun --max-restarts``, with no line of
the exporter's: rank 0 saves a checkpoint (model, AdamW, scheduler, step) every --checkpoint-every steps, every rank
resumes from the last one, --slow-rank reads its batches --slow-seconds slower, and --die-rank dies at --die-step of
the first attempt. The others are then stopped by torchrun (SIGTERM), and all start again.

Each process writes its own clocks to --clocks/<rank>.<attempt>.json as it goes: its start, the step it resumed from,
and for each of its steps the seconds that were ``step`` (the step's wall time less its wait for data and its save),
and, if it is stopped or dies, when; the test compares the exporter's figures with them.

    torchrun --standalone --nproc-per-node 4 --max-restarts 1 restarted_ddp.py --steps 60 --clocks DIR
    (or --until <unix time> instead of --steps)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from pathlib import Path

import psutil
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset


class Samples(Dataset):
    def __init__(self, batch: int, delay: float):
        self.batch, self.delay = batch, delay

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, index: int):
        if self.delay and index % self.batch == 0:
            time.sleep(self.delay)
        return torch.randn(64), torch.tensor(index % 10)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=1 << 30)
    parser.add_argument("--until", type=float, default=None, help="unix time to stop at (rank 0 decides)")
    parser.add_argument("--clocks", type=Path, required=True)
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--device-seconds", type=float, default=0.05)
    parser.add_argument("--slow-rank", type=int, default=None)
    parser.add_argument("--slow-seconds", type=float, default=0.0)
    parser.add_argument("--die-rank", type=int, default=None)
    parser.add_argument("--die-step", type=int, default=None)
    args = parser.parse_args()

    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    rank = int(os.environ["RANK"])
    clocks = {"start": psutil.Process().create_time(), "attempt": attempt, "steps": [], "resumed": 0}
    path = args.clocks / f"{rank}.{attempt}.json"

    def write(**extra) -> None:
        clocks.update(extra)
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(clocks))
        os.replace(temporary, path)

    def stopped(signum, frame) -> None:  # torchrun stops the others: record when, and end as a killed process does
        write(ended=time.time())
        os._exit(1)

    signal.signal(signal.SIGTERM, stopped)
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1000)
    step = 0
    if args.checkpoint.exists():
        state = torch.load(args.checkpoint, weights_only=False)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        step = state["step"]
    write(resumed=step)
    delay = args.slow_seconds if rank == args.slow_rank else 0.0
    batches = iter(DataLoader(Samples(16, delay), batch_size=16))
    last = time.perf_counter()
    try:
        while step < args.steps:
            waited = time.perf_counter()
            x, y = next(batches)
            waited = time.perf_counter() - waited
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            time.sleep(args.device_seconds)  # where a real job waits for its device
            optimizer.step()
            scheduler.step()
            step += 1
            now = time.perf_counter()
            clocks["steps"].append([step, now - last - waited])
            last = now
            write(last_step=time.time())
            if attempt == 0 and rank == args.die_rank and step == args.die_step:
                write(ended=time.time())
                os._exit(3)  # dies without a word, as a device error would
            if rank == 0 and step % args.checkpoint_every == 0:
                saved = time.perf_counter()
                state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
                torch.save({**state, "scheduler": scheduler.state_dict()}, args.checkpoint.with_suffix(".tmp"))
                os.replace(args.checkpoint.with_suffix(".tmp"), args.checkpoint)
                last += time.perf_counter() - saved  # the save is checkpoint, not step
            dist.barrier()  # every rank resumes from the same checkpoint
            if args.until is not None and step % 20 == 0:  # every rank stops at the same step: rank 0 decides
                done = torch.tensor(float(rank == 0 and time.time() > args.until))
                dist.broadcast(done, 0)
                if done.item():
                    break
    except BaseException:  # a collective the dead rank left fails here: record when this process ended
        write(ended=time.time())
        raise
    write(finished=time.time())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
