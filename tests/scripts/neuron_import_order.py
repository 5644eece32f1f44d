"""An eager training loop on the emulated TorchNeuron device with no exporter code, whose first imports are given:
the orders zero code must survive on TorchNeuron.

    neuron_import_order.py STEPS MODULE [MODULE ...]

Imports each MODULE in turn (``torch_neuronx``, ``torch``, ``torch._dynamo``), then trains STEPS optimizer steps on
the ``neuron`` device, reading the loss once a step, and exits. The stand-in ``torch_neuronx`` must be on
``PYTHONPATH`` (tests/support/torchneuron).
"""

import importlib
import sys

steps, modules = int(sys.argv[1]), sys.argv[2:]
for module in modules:
    importlib.import_module(module)

import torch  # noqa: E402 (the imports above are the test)
import torch_neuronx  # noqa: E402, F401

model = torch.nn.Linear(8, 4).to("neuron")
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(steps):
    optimizer.zero_grad()
    loss = model(torch.randn(16, 8).to("neuron")).sum()
    loss.backward()
    optimizer.step()
    loss.item()
