"""A small training job on the CPU (torch only, no torch_xla) that calls attach(), for the job endpoint tests.

    endpoint_job.py PORT SPOOL_DIR [OPTION=VALUE ...]

Trains a few optimizer steps, prints one JSON line ({"port": handle.port, "url": handle.url, "pid": ...}), then
keeps stepping every 0.1 s (a live rank) until its standard input closes, and exits normally (detach at exit).
"""

from __future__ import annotations

import json
import os
import sys
import threading

import torch

import neuron_exporter

port, spool_dir = int(sys.argv[1]), sys.argv[2]
options = {key: float(value) for key, value in (arg.split("=", 1) for arg in sys.argv[3:])}
handle = neuron_exporter.attach(port=port, addr="127.0.0.1", spool_dir=spool_dir, **options)
model = torch.nn.Linear(4, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)


def step() -> None:
    optimizer.zero_grad()
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()


for _ in range(3):
    step()
print(json.dumps({"port": handle.port, "url": handle.url, "pid": os.getpid()}), flush=True)
released = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), released.set()), daemon=True).start()
while not released.wait(0.1):
    step()
