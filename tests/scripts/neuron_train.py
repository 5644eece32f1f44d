"""An eager training loop on the emulated TorchNeuron ``neuron`` device (tests/support/torchneuron), and with
``--compile`` a module compiled with ``torch.compile(backend="neuron")``.

Usage: python neuron_train.py STEPS [--attach] [--compile] [--until PATH]

Each eager step: ``torch.lgamma`` (no Neuron kernel: path a, only in TorchNeuron's set; its backward calls
``digamma``), ``torch.digamma`` (a Python-registered op that runs on the CPU: path b, one ``_log_offloaded_op``
per call, forward and backward), and one ``.item()``. With ``--compile``: the compiled module runs with a batch of
8, then 12 (a recompilation), then with its in-memory cache cleared and dynamo reset (persistent-cache hits), and
once with its execution made to fail (it runs eagerly, and says why).

Prints one JSON line when training is done: what the stand-in recorded (its own account, to compare with a
scrape), then waits: each line read from stdin prints the device's synchronizations so far; the end of stdin ends.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support" / "torchneuron"))
steps = int(sys.argv[1])
handle = None
if "--attach" in sys.argv:
    import neuron_exporter

    handle = neuron_exporter.attach(port=0, addr="127.0.0.1", spool_dir=tempfile.mkdtemp(), node_view=False)

import torch  # noqa: E402
import torch_neuronx  # noqa: E402
from torch._dynamo.utils import counters  # noqa: E402
from torch_neuronx import _C  # noqa: E402
from torch_neuronx.neuron_dynamo_backend import backend  # noqa: E402

torch.manual_seed(0)
model = torch.nn.Linear(8, 4).to("neuron")
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
losses = []
for _ in range(steps):
    x = torch.randn(16, 8).to("neuron")
    out = model(x)
    loss = torch.lgamma(out.abs() + 1).mean() + torch.digamma(out.abs() + 1).mean()  # site: digamma forward
    loss.backward()  # site: backward
    optimizer.step()
    optimizer.zero_grad()
    losses.append(loss.item())  # site: item

if "--compile" in sys.argv:
    compiled = torch.compile(model, backend="neuron")
    for batch in (8, 8, 12):
        compiled(torch.randn(batch, 8).to("neuron")).sum().backward()
    _C._clear_compilation_memory_cache()
    torch._dynamo.reset()
    compiled(torch.randn(8, 8).to("neuron")).sum().backward()  # from the persistent cache
    backend.fail_executions.append("NRT execution failed: NEFF load error (code 1103)")
    compiled(torch.randn(8, 8).to("neuron")).sum().backward()

print(
    json.dumps(
        {
            "url": handle.url if handle is not None else None,
            "optimizer_steps": steps,
            "offloaded_calls": dict(_C.offloaded_calls),
            "fallback_ops": torch_neuronx.get_fallback_ops(),
            "cache": _C._get_compilation_cache_stats(),
            "neuron_counters": dict(counters["neuron"]),
            "memory": torch.neuron.memory_stats(),
            "syncs": _C.syncs,
            "torch_xla_loaded": "torch_xla" in sys.modules,
        }
    ),
    flush=True,
)
if "--until" in sys.argv:  # go on training, as a job does while it is scraped, until PATH exists
    until = Path(sys.argv[sys.argv.index("--until") + 1])
    compiled = torch.compile(model, backend="neuron")
    iteration = 0
    while not until.exists():
        out = model(torch.randn(16, 8).to("neuron"))
        loss = torch.lgamma(out.abs() + 1).mean() + torch.digamma(out.abs() + 1).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        loss.item()
        if iteration % 30 == 29:
            backend.fail_executions.append("NRT execution failed: NEFF load error (code 1103)")
        compiled(torch.randn(8 + (iteration // 50) % 4, 8).to("neuron")).sum().backward()  # a new shape now and then
        iteration += 1
for _ in sys.stdin:
    print(json.dumps({"syncs": _C.syncs}), flush=True)
