"""A ``torch.compile`` whose compiler works until told to stop, as neuronx-cc may for half an hour on a large model:
the exporter must serve the time as ``compile`` while it runs.

Usage: python long_compile.py RELEASE_FILE

Prints one JSON line {"url": ...} once attached (the rank's own endpoint), then compiles until RELEASE_FILE exists,
makes one training step and detaches.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

import neuron_exporter

handle = neuron_exporter.attach(port=0, addr="127.0.0.1", spool_dir=tempfile.mkdtemp(), node_view=False)

import torch  # noqa: E402

print(json.dumps({"url": handle.url}), flush=True)


def compiler(graph: torch.fx.GraphModule, example_inputs: list) -> object:
    while not os.path.exists(sys.argv[1]):
        time.sleep(0.05)
    return graph.forward


model = torch.nn.Linear(4, 4)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
compiled = torch.compile(model, backend=compiler)
compiled(torch.randn(2, 4)).sum().backward()
optimizer.step()
neuron_exporter.detach()
