"""A source whose hooks cannot go in at its first try starts at the training thread's next chance.

    source_retry.py SOURCE

Imports SOURCE's library (torch, torch._dynamo or torch_xla), makes that source's first ``install()`` fail, attaches,
then makes an optimizer (the next chance) and trains three steps (on the XLA device for ``xla``; through
``torch.compile`` for ``torch_compile``). Prints one JSON object: the scrapes before the optimizer and after training.
"""

import json
import sys
import tempfile
import urllib.request

import torch

name = sys.argv[1]
if name == "xla":
    import torch_xla
if name == "torch_compile":
    import torch._dynamo

import neuron_exporter  # noqa: E402
from neuron_exporter.training import attach as attach_module  # noqa: E402
from neuron_exporter.training.source import SourceKind  # noqa: E402

tries = []


def failing_once(kind: SourceKind) -> SourceKind:
    def start(sources):
        source = kind.start(sources)
        tries.append(kind.name)
        if len(tries) == 1:

            def install():
                raise RuntimeError(f"injected failure of {kind.name}")

            source.install = install
        return source

    return SourceKind(kind.name, kind.library, start)


attach_module.SOURCES = tuple(failing_once(k) if k.name == name else k for k in attach_module.SOURCES)
handle = neuron_exporter.attach(port=0, addr="127.0.0.1", spool_dir=tempfile.mkdtemp(), node_view=False)


def scrape() -> str:
    with urllib.request.urlopen(handle.url, timeout=30) as response:
        return response.read().decode()


before = scrape()
device = torch_xla.device() if name == "xla" else torch.device("cpu")
model = torch.nn.Linear(16, 4).to(device)
forward = torch.compile(model, backend="eager") if name == "torch_compile" else model
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(3):
    optimizer.zero_grad()
    forward(torch.randn(8, 16).to(device)).sum().backward()
    optimizer.step()
    if name == "xla":
        torch_xla.sync()
print(json.dumps({"before": before, "after": scrape(), "tries": len(tries)}))
handle.detach()
