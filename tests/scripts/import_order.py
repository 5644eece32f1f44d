"""A training script with no exporter code, whose first imports are given: the orders zero code must survive.

    import_order.py STEPS MODULE [MODULE ...]

Imports each MODULE in turn (``torch_xla``, ``torch_xla.core.xla_model``, ``torch``, ``torch._dynamo``, ...), then
trains STEPS optimizer steps on the XLA device, a step marker each, and exits.
"""

import importlib
import sys

steps, modules = int(sys.argv[1]), sys.argv[2:]
for module in modules:
    importlib.import_module(module)

import torch  # noqa: E402 (the imports above are the test)

import torch_xla  # noqa: E402

device = torch_xla.device()
model = torch.nn.Linear(16, 4).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(steps):
    optimizer.zero_grad()
    model(torch.randn(8, 16).to(device)).sum().backward()
    optimizer.step()
    torch_xla.sync()
