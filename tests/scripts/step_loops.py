"""Training loops shaped like real ones, to check that steps are counted as the user counts them.

Usage: python step_loops.py SCENARIO STEPS

Scenarios:
- loader: MpDeviceLoader feeding a loop that steps with xm.optimizer_step (no barrier: the loader's next batch ends
  the step);
- accumulation: gradient accumulation, 4 micro-batches per optimizer step, a step marker after each micro-batch;
- closure_logging: a step closure every step, and a logging .item() of the loss every 5 steps before the marker;
- cpu_then_xla: STEPS steps of a model on the CPU, then STEPS of another, with an optimizer of its own, on the XLA
  device.

Prints one JSON line with the endpoint's URL when the loop is done, then waits for stdin to close.
"""

from __future__ import annotations

import json
import sys
import tempfile

import torch
from torch.utils.data import DataLoader, TensorDataset

import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.distributed.parallel_loader as pl

import neuron_exporter

scenario, steps = sys.argv[1], int(sys.argv[2])
handle = neuron_exporter.attach(port=0, addr="127.0.0.1", spool_dir=tempfile.mkdtemp())
torch.manual_seed(0)
device = torch_xla.device()
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
loss_fn = torch.nn.CrossEntropyLoss()
logged = []

if scenario == "loader":
    data = TensorDataset(torch.randn(8 * steps, 16), torch.randint(0, 4, (8 * steps,)))
    for x, y in pl.MpDeviceLoader(DataLoader(data, batch_size=8), device):
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        xm.optimizer_step(optimizer)
elif scenario == "accumulation":
    for _ in range(steps):
        for _ in range(4):
            x, y = torch.randn(8, 16).to(device), torch.randint(0, 4, (8,)).to(device)
            (loss_fn(model(x), y) / 4).backward()
            torch_xla.sync()
        optimizer.step()
        optimizer.zero_grad()
        torch_xla.sync()
elif scenario == "closure_logging":
    for step in range(steps):
        x, y = torch.randn(8, 16).to(device), torch.randint(0, 4, (8,)).to(device)
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        if step % 5 == 4:
            logged.append(loss.item())  # a logging step: cuts the graph before the marker
        xm.add_step_closure(lambda loss=loss: logged.append(float(loss)))
        torch_xla.sync()
elif scenario == "cpu_then_xla":
    on_cpu = torch.nn.Linear(16, 4)
    cpu_optimizer = torch.optim.SGD(on_cpu.parameters(), lr=0.01)
    for _ in range(steps):
        cpu_optimizer.zero_grad()
        loss_fn(on_cpu(torch.randn(8, 16)), torch.randint(0, 4, (8,))).backward()
        cpu_optimizer.step()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(steps):
        x, y = torch.randn(8, 16).to(device), torch.randint(0, 4, (8,)).to(device)
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()
        torch_xla.sync()
else:
    raise SystemExit(f"unknown scenario {scenario}")

print(json.dumps({"url": handle.url, "logged": len(logged)}), flush=True)
sys.stdin.read()
