"""A real training loop on the XLA CPU device shaped like a Hugging Face Trainer run, exported with attach(), for
the end-to-end test against Prometheus.

Usage: python trainer_shaped.py STOP_FILE [SPOOL_DIR]

Prints one JSON line {"url": ..., "port": ...} once the endpoint is up, then trains until STOP_FILE exists (at
most MAX_STEPS steps). Each training step, as the Trainer runs it on XLA:

- the forward pass checks a device tensor with `if` (a `bool()`: the graph built so far runs and the host reads
  the result): one graph cut per step;
- a step marker after backward, and another after the optimizer step: two markers per training step, which are
  not cuts;
- every LOG_EVERY steps, a logging `.item()` of the mean of the accumulated loss: one more cut.

So about 1.2 cuts, 2 markers and 3.2 graphs per training step, and no CPU fallback. The warm-up covers the first
logging step, whose graphs are new. As in the Trainer, the batches come from a DataLoader, so the rank counts its
samples and FLOPs, and the `peak_flops` option gives it a peak (the CPU device has none): every panel and rule of
throughput and MFU has data. The lines the test looks for carry a ``# site:`` comment. Each step waits PACE seconds
so that the run does not starve the Prometheus server on a small machine.
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
PACE = 0.05
LOG_EVERY = 5
PEAK_FLOPS = 1e12


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden = torch.nn.Linear(16, 32)
        self.out = torch.nn.Linear(32, 4)

    def forward(self, x):
        h = torch.relu(self.hidden(x))
        if not torch.isfinite(h).all():  # site: check (a device tensor as a bool: cuts the graph every step)
            raise FloatingPointError("non-finite activations")
        return self.out(h)


class Samples(torch.utils.data.IterableDataset):
    """Random samples without end, batched by the DataLoader."""

    def __iter__(self):
        while True:
            yield torch.randn(16), torch.randint(0, 4, ())


stop_file = sys.argv[1]
spool_dir = sys.argv[2] if len(sys.argv) > 2 else tempfile.mkdtemp()
handle = neuron_exporter.attach(
    port=0, addr="127.0.0.1", warmup_steps=LOG_EVERY + 2, spool_dir=spool_dir, peak_flops=PEAK_FLOPS
)
print(json.dumps({"url": handle.url, "port": handle.port}), flush=True)

torch.manual_seed(0)
device = torch_xla.device()
model = Model().to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
tr_loss = torch.zeros((), device=device)
logged = []
batches = iter(torch.utils.data.DataLoader(Samples(), batch_size=8))

for step in range(MAX_STEPS):
    if os.path.exists(stop_file):
        break
    x, y = next(batches)
    x, y = x.to(device), y.to(device)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    torch_xla.sync()  # the end of the Trainer's training_step (xm.mark_step)
    tr_loss += loss.detach()
    optimizer.step()
    optimizer.zero_grad()
    torch_xla.sync()  # after the optimizer step
    if (step + 1) % LOG_EVERY == 0:
        logged.append((tr_loss / LOG_EVERY).item())  # site: logging (the logging host read)
        tr_loss.zero_()
    time.sleep(PACE)

neuron_exporter.detach()
