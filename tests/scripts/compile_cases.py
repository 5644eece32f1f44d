"""Functions compiled with torch.compile that recompile, break their graphs or hit the recompile limit at known
lines, and a clean compiled training loop, to check what the exporter says about them.

Usage: python compile_cases.py SCENARIO BACKEND STEPS [--no-attach] [--unknown-torch]

SCENARIO: shapes (the batch size changes), int_arg (a Python int argument changes), print, branch (data-dependent
control flow), limit (torch._dynamo.config.recompile_limit lowered to 2), train (a clean training loop).
BACKEND: a torch.compile backend; with "openxla" the tensors live on the XLA device and every step ends with
torch_xla.sync(). torch_xla is imported whenever it is installed, attached or not (importing it turns dynamo's
automatic dynamic shapes off), so both runs of a case compile alike. --unknown-torch: dynamo's compilation records
and its graph-break call look as on a torch the exporter does not know. Lines the tests look for carry a ``# site:``
comment. Prints one JSON line when the loop is done ({"url", "torch": what torch's own records say}), then waits for
stdin to close.
"""

from __future__ import annotations

import importlib.util
import io
import json
import logging
import os
import re
import sys
import tempfile

import torch
import torch._dynamo
from torch._dynamo.utils import get_compilation_metrics

scenario, backend, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
if backend == "openxla" or importlib.util.find_spec("torch_xla") is not None:
    import torch_xla

# torch's own account of graph breaks: dynamo logs one record per graph break to its graph_breaks artifact logger.
logged_breaks = []


class GraphBreakLog(logging.Handler):
    def emit(self, record):
        message = record.getMessage()
        where = re.search(r"in user code at (.+?):(\d+)", message)
        reason = re.search(r"Graph Break Reason: (.*)", message)
        logged_breaks.append(
            [
                f"{os.path.relpath(where.group(1))}:{where.group(2)}" if where else None,
                reason.group(1) if reason else None,
            ]
        )


graph_break_log = logging.getLogger("torch._dynamo.symbolic_convert.__graph_breaks")
graph_break_log.setLevel(logging.DEBUG)
graph_break_log.propagate = False  # kept here, not printed
graph_break_log.addHandler(GraphBreakLog())

handle = None
if "--no-attach" not in sys.argv:
    import neuron_exporter
    from neuron_exporter.training.torch_compile import probes

    if "--unknown-torch" in sys.argv:  # records with a field this torch lacks, a graph-break call of no known shape
        probes.RECORD_FIELDS += ("a_field_of_a_future_torch",)
        probes.BREAK_SHAPES = {}
    handle = neuron_exporter.attach(port=0, addr="127.0.0.1", warmup_steps=2, spool_dir=tempfile.mkdtemp())

device = torch_xla.device() if backend == "openxla" else torch.device("cpu")
sink = io.StringIO()
torch.manual_seed(0)


def end_step():
    if backend == "openxla":
        torch_xla.sync()


def shapes(x):  # site: shapes function
    return torch.relu(x) * 2 + 1


def int_arg(x, n):  # site: int_arg function
    return x * n + 1


def noisy(x):  # site: print function
    y = x * 2
    print("noisy", y.shape, file=sink)  # site: print
    return y + 1


def branch(x):  # site: branch function
    if x.sum() > 0:  # site: branch
        return x * 2
    return -x


def shifted(x, n):  # site: limit function
    return x + n


if scenario == "shapes":
    compiled = torch.compile(shapes, backend=backend)
    for step in range(steps):
        compiled(torch.randn(4 + step, 8, device=device))  # a new batch size every step
        end_step()
elif scenario == "int_arg":
    compiled = torch.compile(int_arg, backend=backend)
    x = torch.randn(4, 8, device=device)
    for step in range(steps):
        compiled(x, step + 2)
        end_step()
elif scenario == "print":
    compiled = torch.compile(noisy, backend=backend)
    x = torch.randn(4, 8, device=device)
    for _ in range(steps):
        compiled(x)
        end_step()
elif scenario == "branch":
    compiled = torch.compile(branch, backend=backend)
    x = torch.randn(4, 8, device=device)
    for _ in range(steps):
        compiled(x)
        end_step()
elif scenario == "limit":
    torch._dynamo.config.recompile_limit = 2
    compiled = torch.compile(shifted, backend=backend, dynamic=False)  # every new n is a new graph
    x = torch.randn(4, 8, device=device)
    for step in range(steps):
        compiled(x, step)
        end_step()
elif scenario == "train":
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).to(device)
    compiled = torch.compile(model, backend=backend)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(8, 16).to(device), torch.randint(0, 4, (8,)).to(device)
    for _ in range(steps):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(compiled(x), y)  # site: train call
        loss.backward()
        optimizer.step()
        end_step()
else:
    raise SystemExit(f"unknown scenario {scenario}")
# Whether the exporter had taken the newest compilation record before anything scraped it: in the training loop, the
# optimizer step after a compilation reads it.
taken_while_training = (
    handle is not None and handle.sources.get("torch_compile")._newest is get_compilation_metrics()[-1]
)

if backend == "openxla":
    torch_xla._XLAC._xla_wait_device_ops(devices=[])


def place(filename, line):
    return f"{os.path.relpath(filename)}:{line}" if filename else None


def at_limit(record):
    """A compilation refused at the recompile limit: RecompileLimitExceeded up to torch 2.10, then an Unsupported."""
    return record.fail_type == "RecompileLimitExceeded" or (
        record.fail_type == "Unsupported" and (record.fail_reason or "").startswith("Dynamo recompile limit exceeded")
    )


# torch's own account of compilations: its compilation records (fewer than the ring's 64 here)
records = [r for r in get_compilation_metrics() if not r.is_runtime]
functions = {r.compile_id.split("/")[0]: place(r.co_filename, r.co_firstlineno) for r in records if r.co_filename}
forward = [r for r in records if r.is_forward is not False]
own = {
    "compilations": [place(r.co_filename, r.co_firstlineno) for r in forward if r.fail_type is None],
    "recompilations": [
        [place(r.co_filename, r.co_firstlineno), r.recompile_reason]
        for r in forward
        if r.recompile_reason and r.fail_type is None
    ],
    "limit_hits": [functions.get(r.compile_id.split("/")[0]) for r in forward if at_limit(r)],
    "graph_breaks": logged_breaks,
    "compile_ids": [r.compile_id for r in forward],
    "compile_seconds": sum((r.duration_us or 0) / 1e6 for r in records),
}
print(
    json.dumps({"url": handle.url if handle else None, "torch": own, "taken_while_training": taken_while_training}),
    flush=True,
)
sys.stdin.read()
