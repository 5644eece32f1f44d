"""A compiled ``nn.Module`` trained with AdamW on the CPU: what a torch.compile user runs, with no torch_xla.

Usage: python compiled_train.py STEPS [--attach] [--backend NAME]

With ``--attach`` the script calls ``neuron_exporter.attach()``; without it, it relies on ``neuron-exporter run``
(or ``NEURON_EXPORTER_AUTO=1``). The batch grows from 8 to 12 halfway: one recompilation. Prints one JSON line
({"url", "optimizer_steps", "compiled": dynamo's own compilations of a code object, by compile id,
"recompiled": those with a recompile reason, "torch_xla_loaded"}) when training is done, then waits for stdin to
close.
"""

from __future__ import annotations

import json
import sys
import tempfile

steps = int(sys.argv[1])
backend = sys.argv[sys.argv.index("--backend") + 1] if "--backend" in sys.argv else "aot_eager"
handle = None
if "--attach" in sys.argv:
    import neuron_exporter

    handle = neuron_exporter.attach(port=0, addr="127.0.0.1", spool_dir=tempfile.mkdtemp(), node_view=False)

import torch  # noqa: E402
from torch._dynamo.utils import get_compilation_metrics  # noqa: E402

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
compiled = torch.compile(model, backend=backend)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(steps):
    batch = 8 if step < steps // 2 else 12
    optimizer.zero_grad()
    compiled(torch.randn(batch, 16)).sum().backward()
    optimizer.step()

records = [r for r in get_compilation_metrics() if r.co_filename]  # a code object compiled (not a backward record)
print(
    json.dumps(
        {
            "url": handle.url if handle is not None else None,
            "optimizer_steps": steps,
            "compiled": len({str(r.compile_id) for r in records}),
            "recompiled": len({str(r.compile_id) for r in records if r.recompile_reason}),
            "torch_xla_loaded": "torch_xla" in sys.modules,
        }
    ),
    flush=True,
)
sys.stdin.read()
