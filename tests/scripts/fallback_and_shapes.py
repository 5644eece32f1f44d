"""A real training loop on the XLA CPU device with one CPU-fallback operator and one shape change, exported with
attach(), for the end-to-end test against Prometheus.

Usage: python fallback_and_shapes.py STOP_FILE [SPOOL_DIR]

Prints one JSON line {"url": ...} once the endpoint is up, then trains until STOP_FILE exists (at most
MAX_STEPS steps): a small MLP whose loss goes through torch.lgamma (no XLA lowering, so it runs on the CPU), with
the batch size changing once after warm-up (one recompilation). Each step waits PACE seconds so that the
run does not starve the Prometheus server on a small machine.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

import torch

import torch_xla

import neuron_exporter

MAX_STEPS = 100_000
PACE = 0.02
SHAPE_CHANGE_AT = 10  # after the 2 warm-up steps

stop_file = sys.argv[1]
spool_dir = sys.argv[2] if len(sys.argv) > 2 else tempfile.mkdtemp()
handle = neuron_exporter.attach(port=0, addr="127.0.0.1", warmup_steps=2, spool_dir=spool_dir)
print(json.dumps({"url": handle.url, "port": handle.port}), flush=True)

torch.manual_seed(0)
device = torch_xla.device()
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

for step in range(MAX_STEPS):
    if os.path.exists(stop_file):
        break
    batch = 8 if step < SHAPE_CHANGE_AT else 12
    x, y = torch.randn(batch, 16).to(device), torch.randint(0, 4, (batch,)).to(device)
    optimizer.zero_grad()
    out = model(x)
    out = out + 0.01 * torch.lgamma(out.abs() + 1)
    loss = torch.nn.functional.cross_entropy(out, y)
    loss.backward()
    optimizer.step()
    torch_xla.sync()
    time.sleep(PACE)

neuron_exporter.detach()
