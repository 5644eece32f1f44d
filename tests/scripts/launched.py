"""A script trained in processes started by torch_xla.launch, with attach() in one of the places users put it.

Usage: python launched.py PLACEMENT START_METHOD STEPS WORKDIR

PLACEMENT: top (first line of the script), mp_fn (first line of the function each process runs), main (under
``if __name__ == "__main__":``, before the launch). The exporter's options come from NEURON_EXPORTER_* variables.
Each training process writes WORKDIR/trained-<pid> when its loop is done, then waits for WORKDIR/go.
"""

import os
import sys
import time
from pathlib import Path

placement, start_method, steps, workdir = sys.argv[1], sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])

if placement == "top":
    import neuron_exporter

    neuron_exporter.attach()

import torch  # noqa: E402

import torch_xla  # noqa: E402
import torch_xla.core.xla_model as xm  # noqa: E402


def _mp_fn(index):
    if placement == "mp_fn":
        import neuron_exporter

        neuron_exporter.attach()
    device = torch_xla.device()
    model = torch.nn.Linear(16, 4).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(steps):
        optimizer.zero_grad()
        model(torch.randn(8, 16).to(device)).sum().backward()
        xm.optimizer_step(optimizer, barrier=True)
    (workdir / f"trained-{os.getpid()}").write_text("")
    while not (workdir / "go").exists():
        time.sleep(0.02)


if __name__ == "__main__":
    if placement == "main":
        import neuron_exporter

        neuron_exporter.attach()
    torch_xla.launch(_mp_fn, start_method=start_method)
