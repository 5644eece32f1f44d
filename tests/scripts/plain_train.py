"""A training script with no exporter code at all: what `neuron-exporter run` and NEURON_EXPORTER_AUTO attach to.

    plain_train.py CONTROL_DIR STEPS [item]

Each rank (RANK from the launcher, 0 without one) trains STEPS optimizer steps, writes CONTROL_DIR/trained-<rank>,
then waits for CONTROL_DIR/release. With ``item``, each step reads its loss before the step ends (a graph cut at
the line marked ``# site: item``).
"""

import os
import sys
import time
from pathlib import Path

import torch

import torch_xla

control, steps = Path(sys.argv[1]), int(sys.argv[2])
read_loss = sys.argv[3:] == ["item"]
rank = os.environ.get("RANK", "0")
device = torch_xla.device()
model = torch.nn.Linear(16, 4).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(steps):
    optimizer.zero_grad()
    loss = model(torch.randn(8, 16).to(device)).sum()
    loss.backward()
    optimizer.step()
    if read_loss:
        loss.item()  # site: item
    torch_xla.sync()
(control / f"trained-{rank}").write_text(str(os.getpid()))
while not (control / "release").exists():
    time.sleep(0.02)
