"""What counting a batch's samples and tokens costs the training thread, per batch.

Two measures, in one process on the CPU:

- the count alone: the throughput source's ``entered()`` and ``left()`` around one batch, as the shared wrapper of
  the input pipelines' entry points calls them, for batches of several shapes (a Hugging Face dict, a mapping that
  is not a dict as ``BatchEncoding`` is, ``(images, labels)``, a plain ``LongTensor``, a dict nested in a tuple);
- a DataLoader's ``next()`` end to end, over batches made beforehand (``batch_size=None``: the loader's own work is
  as small as it gets, so the exporter's share is as large as it gets), in blocks: bare, ``attach()`` with the data
  phase and the throughput both listening, and ``attach()`` with the data phase alone; each attached block next to
  a bare one, the pairs in a random order each round. Reported: the median time per batch of each, and the median
  over rounds of each attached block's extra time per batch over its bare one.

    python benchmarks/batch_overhead.py [--rounds 40] [--batches 2000] [--repeat 200000]
"""

from __future__ import annotations

import argparse
import collections
import random
import statistics
import tempfile
import time

import torch
from torch.utils.data import DataLoader

import neuron_exporter
from neuron_exporter.training.input_pipelines import PIPELINES

B, S = 8, 512


def hf_batch() -> dict:
    ids = torch.randint(0, 32_000, (B, S))
    return {"input_ids": ids, "attention_mask": torch.ones(B, S, dtype=torch.int64), "labels": ids.clone()}


BATCHES = {
    "Hugging Face dict": hf_batch(),
    "UserDict (BatchEncoding's shape)": collections.UserDict(hf_batch()),
    "(images, labels)": (torch.randn(B, 3, 32, 32), torch.randint(0, 10, (B,))),
    "LongTensor[B, S]": torch.randint(0, 32_000, (B, S)),
    "({input_ids}, labels)": ({"input_ids": torch.randint(0, 32_000, (B, S))}, torch.randint(0, 10, (B,))),
}


def count_alone(source, repeat: int) -> None:
    print(f"The count alone (entered() and left() around one batch), median of 5 runs of {repeat}:")
    for name, batch in BATCHES.items():
        runs = []
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(repeat):
                source.left(source.entered(), batch)
            runs.append((time.perf_counter() - start) / repeat)
        print(f"  {name:34} {statistics.median(runs) * 1e6:6.2f} µs")


def block(batches: int) -> float:
    """Seconds per batch of a DataLoader's next() over prepared batches."""
    loader = DataLoader([hf_batch() for _ in range(8)] * (batches // 8), batch_size=None)
    start = time.perf_counter()
    for _ in loader:
        pass
    return (time.perf_counter() - start) / batches


def end_to_end(rounds: int, batches: int) -> None:
    both, phases_only = "attach(): data phase and throughput", "attach(): data phase only"
    times: dict[str, list[float]] = {"bare": [], both: [], phases_only: []}
    extra: dict[str, list[float]] = {both: [], phases_only: []}
    for _ in range(rounds):
        for variant in random.sample([both, phases_only], 2):
            attached_first = random.random() < 0.5
            bare = block(batches) if not attached_first else None
            handle = neuron_exporter.attach(port=0, addr="127.0.0.1", spool_dir=tempfile.mkdtemp(), node_view=False)
            throughput = handle.sources.get("throughput")
            if variant == phases_only and throughput is not None:
                PIPELINES.remove(throughput)
            attached = block(batches)
            handle.detach()
            if bare is None:
                bare = block(batches)
            times["bare"].append(bare)
            times[variant].append(attached)
            extra[variant].append(attached - bare)
    print(f"A DataLoader's next() over prepared batches, {rounds} rounds of {batches} batches:")
    for variant, values in times.items():
        line = f"  {variant:38} {statistics.median(values) * 1e6:7.2f} µs/batch"
        if variant in extra:
            quartiles = statistics.quantiles(extra[variant], n=4)
            line += (
                f", extra {statistics.median(extra[variant]) * 1e6:+.2f} µs"
                f" (middle half {quartiles[0] * 1e6:+.2f} to {quartiles[2] * 1e6:+.2f})"
            )
        print(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--batches", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=200_000)
    args = parser.parse_args()
    torch.manual_seed(0)
    handle = neuron_exporter.attach(port=0, addr="127.0.0.1", spool_dir=tempfile.mkdtemp(), node_view=False)
    source = handle.sources.get("throughput")
    assert source is not None, "the throughput source did not start"
    count_alone(source, args.repeat)
    handle.detach()
    end_to_end(args.rounds, args.batches)


if __name__ == "__main__":
    main()
