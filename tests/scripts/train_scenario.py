"""A small real training loop on the XLA CPU device, in one of the scenarios the tests check.

Usage: python train_scenario.py SCENARIO STEPS [--no-attach]

Prints one JSON line when the loop has finished: {"url": ..., "steps": ..., "xla": {counters read from torch_xla}},
then waits until its standard input closes, so the test can scrape the endpoint of a live process.
Scenarios: clean, item, fallback, shapes, and one per step-ending call (mark_step, sync, step, compile,
optimizer_step, mp_device_loader, parallel_loader, prebound_sync).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import warnings

import torch

import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.debug.metrics as met
from torch_xla import sync as prebound_sync  # bound before attach(): the hook must still see it

warnings.simplefilter("ignore", DeprecationWarning)  # xm.mark_step is deprecated, and still widely used

scenario, steps = sys.argv[1], int(sys.argv[2])
attach = "--no-attach" not in sys.argv

handle = None
if attach:
    import neuron_exporter

    handle = neuron_exporter.attach(
        port=0, addr="127.0.0.1", warmup_steps=2, spool_dir=os.environ.get("TEST_SPOOL_DIR") or tempfile.mkdtemp()
    )

torch.manual_seed(0)
device = torch_xla.device()
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
batches = [(torch.randn(8, 16), torch.randint(0, 4, (8,))) for _ in range(steps)]


def train_step(x, y):
    optimizer.zero_grad()
    out = model(x)
    if scenario == "fallback":
        out = out + 0.01 * torch.lgamma(out.abs() + 1)  # no XLA lowering: runs on the CPU
    loss = torch.nn.functional.cross_entropy(out, y)
    loss.backward()
    optimizer.step()
    return loss


def loader_loop(loader_class):
    from torch.utils.data import DataLoader, TensorDataset

    import torch_xla.distributed.parallel_loader as pl

    data = DataLoader(TensorDataset(torch.randn(8 * steps, 16), torch.randint(0, 4, (8 * steps,))), batch_size=8)
    loader = pl.MpDeviceLoader(data, device) if loader_class == "mp" else pl.ParallelLoader(data, [device])
    per_device = loader if loader_class == "mp" else loader.per_device_loader(device)
    for x, y in per_device:
        train_step(x, y)  # the loader's own syncs end the steps


if scenario == "mp_device_loader":
    loader_loop("mp")
elif scenario == "parallel_loader":
    loader_loop("parallel")
else:
    for i, (x, y) in enumerate(batches):
        if scenario == "shapes":
            x, y = torch.randn(8 + i, 16), torch.randint(0, 4, (8 + i,))
        x, y = x.to(device), y.to(device)
        if scenario == "step":
            with torch_xla.step():
                train_step(x, y)
        elif scenario == "compile":
            torch_xla.compile(train_step)(x, y)
        elif scenario == "optimizer_step":
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            xm.optimizer_step(optimizer, barrier=True)
        else:
            loss = train_step(x, y)
            if scenario == "item":
                loss.item()  # a host read before the step ends: cuts the graph in two
            if scenario == "mark_step":
                xm.mark_step()
            elif scenario == "prebound_sync":
                prebound_sync()
            else:
                torch_xla.sync()

xm.wait_device_ops()  # let asynchronous executions land before the counters are read
counters = {
    name: met.counter_value(name) or 0
    for name in ("UncachedCompile", "CachedCompile", "MarkStep", "ExecuteComputation")
}
counters["ExecuteTime"] = (met.metric_data("ExecuteTime") or (0,))[0]
counters["TransferFromDeviceTime"] = (met.metric_data("TransferFromDeviceTime") or (0,))[0]
print(json.dumps({"url": handle.url if handle else None, "pid": os.getpid(), "xla": counters}), flush=True)
sys.stdin.read()
