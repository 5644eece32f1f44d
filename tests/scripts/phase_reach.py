"""What the data and checkpoint phases reach besides ``next()`` and ``torch.save``, timed by the script itself: a
DataLoader's ``iter()`` (its worker processes start there), and ``torch.distributed.checkpoint.async_save`` with the
wait on its future. Prints one JSON line: the script's clocks and the exported totals, after a few optimizer steps.
"""

from __future__ import annotations

import json
import tempfile
import time

import neuron_exporter

handle = neuron_exporter.attach(port=0, addr="127.0.0.1", spool_dir=tempfile.mkdtemp(), node_view=False)

import torch  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402

clocks = {"data": 0.0, "checkpoint": 0.0}
parts = {"iter": 0.0, "async_save": 0.0, "wait": 0.0}  # the part of each clock that the phase did not reach before


class Samples(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int):
        return torch.randn(4), torch.randn(1)


def slow_worker_start(worker_id: int) -> None:
    time.sleep(0.3)  # a worker that takes its time to start: iter() waits for none, the first next() for it


model = torch.nn.Linear(4, 1)
ballast = torch.randn(16_000_000)  # 64 MB: a save worth waiting for
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
loader = torch.utils.data.DataLoader(Samples(), batch_size=8, num_workers=4, worker_init_fn=slow_worker_start)
for _ in range(3):
    start = time.perf_counter()
    batches = iter(loader)  # forks the workers
    parts["iter"] += time.perf_counter() - start
    clocks["data"] += time.perf_counter() - start
    while True:
        start = time.perf_counter()
        try:
            x, y = next(batches)
        except StopIteration:
            clocks["data"] += time.perf_counter() - start
            break
        clocks["data"] += time.perf_counter() - start
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
    start = time.perf_counter()
    saved = dcp.async_save({"model": model.state_dict(), "ballast": ballast}, checkpoint_id=tempfile.mkdtemp())
    parts["async_save"] += time.perf_counter() - start
    clocks["checkpoint"] += time.perf_counter() - start
    time.sleep(0.05)  # training goes on while it saves
    start = time.perf_counter()
    (saved.upload_completion if hasattr(saved, "upload_completion") else saved).result()
    parts["wait"] += time.perf_counter() - start
    clocks["checkpoint"] += time.perf_counter() - start
    optimizer.step()
exported = handle.sources.phases.read()
handle.detach()
print(json.dumps({"clocks": clocks, "parts": parts, "exported": exported}), flush=True)
