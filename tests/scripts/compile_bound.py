"""A torch_xla training loop whose time goes to compiling: every step a new batch size, so every step compiles
its graph again. For the goodput alert against a real Prometheus.

Usage: python compile_bound.py STOP_FILE

Prints one JSON line {"url": ..., "port": ...} once the endpoint is up, then trains until STOP_FILE exists.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

import torch

import torch_xla

import neuron_exporter

handle = neuron_exporter.attach(port=0, addr="127.0.0.1", spool_dir=tempfile.mkdtemp())
print(json.dumps({"url": handle.url, "port": handle.port}), flush=True)

torch.manual_seed(0)
device = torch_xla.device()
model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
step = 0
while not os.path.exists(sys.argv[1]) and step < 20_000:
    batch = 1 + step  # a shape never seen before: a recompilation every step
    x, y = torch.randn(batch, 16).to(device), torch.randn(batch, 4).to(device)
    optimizer.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    optimizer.step()
    torch_xla.sync()
    step += 1
neuron_exporter.detach()
