"""Training loops that cut graphs, fall back to the CPU or recompile at known lines, to check what the exporter
says about where and why.

Usage: python where.py SCENARIO STEPS [--no-attach] [--fallback-sites]

Lines the tests look for carry a ``# site:`` comment. Prints one JSON line ({"url", "xla": torch_xla's own
counters, "graph_breaks": dynamo's count for the compile scenario}) when the loop is done, then waits for stdin to
close.
"""

from __future__ import annotations

import io
import json
import sys
import tempfile
from contextlib import redirect_stdout

import torch

import torch_xla
import torch_xla.debug.metrics as met

scenario, steps = sys.argv[1], int(sys.argv[2])
handle = None
if "--no-attach" not in sys.argv:
    import neuron_exporter

    handle = neuron_exporter.attach(
        port=0,
        addr="127.0.0.1",
        warmup_steps=2,
        spool_dir=tempfile.mkdtemp(),
        fallback_sites="--fallback-sites" in sys.argv,
    )
torch.manual_seed(0)
device = torch_xla.device()
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
loss_fn = torch.nn.CrossEntropyLoss()
out = io.StringIO()
graph_breaks = None


def batch(size: int = 8):
    x = torch.randn(size, 16).to(device)  # site: upload
    return x, torch.randint(0, 4, (size,)).to(device)


def train_step(x, y):
    optimizer.zero_grad()
    hidden = model[1](model[0](x))
    if scenario == "lgamma":
        hidden = hidden + 0.01 * torch.lgamma(hidden.abs() + 1)  # site: lgamma
    if scenario == "roi_align":
        import torchvision

        boxes = torch.tensor([[0, 0.0, 0.0, 4.0, 4.0]], device=device)
        pooled = torchvision.ops.roi_align(hidden.reshape(1, 2, 4, 32), boxes, output_size=2)  # site: roi_align
        hidden = hidden + pooled.sum()
    loss = loss_fn(model[2](hidden), y)
    loss.backward()  # site: backward
    optimizer.step()
    if scenario == "item":
        loss.item()  # site: item
    elif scenario == "bool":
        if loss > 0:  # site: bool
            pass
    elif scenario == "print":
        with redirect_stdout(out):
            print(loss)  # site: print
    elif scenario == "tolist":
        loss.tolist()  # site: tolist
    elif scenario == "save":
        import torch_xla.core.xla_model as xm

        xm.save({"loss": loss}, f"{tempfile.gettempdir()}/where-save-{id(out)}.pt")  # site: save
    torch_xla.sync()  # site: sync
    return loss


if scenario == "shapes":
    for step in range(steps):
        train_step(*batch(8 + step))
elif scenario == "values":
    x, _ = batch()
    for step in range(steps):
        score = model[0](x)[:, : 8 + step].sum()  # a Python int baked into the graph; the upload keeps its shape
        torch_xla.sync()  # site: values sync
elif scenario == "eval_logging":
    for step in range(steps):
        logging_step = step % 3 == 2
        x, y = batch()
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        if logging_step:
            print(f"step {step} loss {loss.item():.3f}", file=out)  # site: logging
        torch_xla.sync()  # site: train sync
        if logging_step:
            with torch.no_grad():
                score = model(batch()[0]).sum()
                torch_xla.sync()  # site: eval
            print(f"eval {float(score):.3f}", file=out)
elif scenario == "markers":
    # Each way of ending a step, on batches of its own size, so that each compiles its own graphs at its line.
    import torch_xla.core.xla_model as xm
    import torch_xla.distributed.parallel_loader as pl

    def forward_backward(x, y):
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()

    for _ in range(steps):
        forward_backward(*batch(8))
        optimizer.step()
        xm.mark_step()  # site: mark_step
    for _ in range(steps):
        forward_backward(*batch(9))
        optimizer.step()
        torch_xla.sync()  # site: torch_xla.sync
    data = [(torch.randn(10, 16), torch.randint(0, 4, (10,))) for _ in range(steps)]
    for x, y in pl.MpDeviceLoader(data, device):  # site: loader
        forward_backward(x, y)
        optimizer.step()
    for _ in range(steps):
        forward_backward(*batch(11))
        xm.optimizer_step(optimizer, barrier=True)  # site: optimizer_step
elif scenario == "compile":

    def scaled(t):
        total = t.sum()
        if total.item() > 0:  # a graph break, with or without the exporter
            return t * 2
        return t

    compiled = torch.compile(scaled, backend="openxla")
    for _ in range(steps):
        compiled(torch.ones(4, device=device))
        torch_xla.sync()
    from torch._dynamo.utils import counters

    graph_breaks = sum(counters["graph_break"].values())
else:
    for _ in range(steps):
        train_step(*batch())

torch_xla._XLAC._xla_wait_device_ops(devices=[])  # executions are counted when they run, asynchronously
own = {name: met.counter_value(name) for name in met.counter_names()}
print(json.dumps({"url": handle.url if handle else None, "xla": own, "graph_breaks": graph_breaks}), flush=True)
sys.stdin.read()
