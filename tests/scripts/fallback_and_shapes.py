"""A real training loop on the XLA CPU device with one CPU-fallback operator and batch sizes that keep changing,
exported with attach(), for the end-to-end test against Prometheus.

Usage: python fallback_and_shapes.py STOP_FILE [SPOOL_DIR]

Prints one JSON line {"url": ...} once the endpoint is up, then trains until STOP_FILE exists (at most
MAX_STEPS steps): a small MLP whose loss goes through torch.lgamma (no XLA lowering, so it runs on the CPU), with
a new batch size every RESHAPE_EVERY steps after warm-up, so that its graphs recompile now and then while
Prometheus scrapes (about 0.013 recompilations per step, two graphs every 150 steps: far below the default storm
threshold of 0.1 per step, and a small share of the step time).
The lines the test looks for carry a ``# site:`` comment. Each step waits PACE seconds so that the run does not
starve the Prometheus server on a small machine.
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
RESHAPE_FROM = 10  # after the 2 warm-up steps
RESHAPE_EVERY = 150
MAX_BATCH = 64  # later sizes come round again, from the compile cache

stop_file = sys.argv[1]
spool_dir = sys.argv[2] if len(sys.argv) > 2 else tempfile.mkdtemp()
# fallback_sites: the dashboards' table of where the fallback operators are called has data
handle = neuron_exporter.attach(port=0, addr="127.0.0.1", warmup_steps=2, spool_dir=spool_dir, fallback_sites=True)
print(json.dumps({"url": handle.url, "port": handle.port}), flush=True)

torch.manual_seed(0)
device = torch_xla.device()
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

for step in range(MAX_STEPS):
    if os.path.exists(stop_file):
        break
    batch = 8 if step < RESHAPE_FROM else 9 + ((step - RESHAPE_FROM) // RESHAPE_EVERY) % (MAX_BATCH - 8)
    x, y = torch.randn(batch, 16).to(device), torch.randint(0, 4, (batch,)).to(device)  # site: upload
    optimizer.zero_grad()
    out = model(x)
    out = out + 0.01 * torch.lgamma(out.abs() + 1)  # site: lgamma
    loss = torch.nn.functional.cross_entropy(out, y)
    loss.backward()  # site: backward
    optimizer.step()
    torch_xla.sync()  # site: sync
    time.sleep(PACE)

neuron_exporter.detach()
