"""Training threads, autograd's thread and a second attach(), timed by the script itself, to hold
``training_time_seconds_total{phase}`` against.

Usage: python threaded_phases.py CASE

- ``two_trainers``: the main thread and a second thread each train a ``torch.compile`` model (a compiler that takes
  COMPILE_SECONDS per graph) with their own data waits and checkpoints; the main thread steps first, so its time is
  the one served.
- ``evaluator``: the main thread trains with a recompilation every few steps while an evaluation thread compiles its
  own model over and over.
- ``openxla``: ``torch.compile(backend="openxla")`` on the XLA device: the first backward compiles on autograd's
  thread while the training thread waits in ``backward()``.
- ``reattach``: trains, ``detach()``, ``attach()`` again, trains on.

Prints one JSON line: the script's own clocks of the main thread (``clocks``), the served totals at the end
(``exported``), and what the case needs besides.
"""

from __future__ import annotations

import json
import sys
import tempfile
import threading
import time
from pathlib import Path

import neuron_exporter

case = sys.argv[1]
handle = neuron_exporter.attach(port=0, addr="127.0.0.1", spool_dir=tempfile.mkdtemp(), node_view=False)

import torch  # noqa: E402
from torch._dynamo.backends.common import aot_autograd  # noqa: E402

COMPILE_SECONDS = 0.3
# The main thread's: checkpoint and data waits; compile, its compiler's own time (a floor of what dynamo's compilations
# took); compile_calls, the whole forward and backward of each step that compiled (a ceiling).
clocks = {"checkpoint": 0.0, "data": 0.0, "compile": 0.0, "compile_calls": 0.0}
local = threading.local()


def exported() -> dict[str, float]:
    return handle.sources.phases.read()


def sleepy_compiler(graph: torch.fx.GraphModule, example_inputs: list) -> object:
    """Takes COMPILE_SECONDS, timed on the compiling thread's clock (the main thread's is the one checked)."""
    time.sleep(COMPILE_SECONDS)
    if getattr(local, "main", False):
        clocks["compile"] += COMPILE_SECONDS
    return graph.forward


# dynamo compiles a frame under a process-wide lock, but a backward graph lazily, at the first backward, outside it:
# the forward and backward compilers both take COMPILE_SECONDS.
backend = aot_autograd(fw_compiler=sleepy_compiler, bw_compiler=sleepy_compiler)
torch._dynamo.config.recompile_limit = torch._dynamo.config.accumulated_recompile_limit = 10_000


def timed(phase: str, function, *args):
    start = time.perf_counter()
    try:
        return function(*args)
    finally:
        if getattr(local, "main", False):
            clocks[phase] += time.perf_counter() - start


class Sleepy(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 10_000

    def __getitem__(self, index: int):
        time.sleep(0.005)
        return torch.randn(8), torch.randn(2)


class Tagged(torch.nn.Module):
    """A model whose forward takes a Python value: a new value is a new compilation. Its shapes are static, so its
    backward graph is compiled lazily, at the first backward, outside dynamo's lock."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))

    def forward(self, x: torch.Tensor, tag: int = 0) -> torch.Tensor:
        return self.layers(x) * (tag + 1)


def train(steps: int, tags: dict[int, int], checkpoint_every: int = 4, compiled: bool = True, compiler=backend) -> None:
    model = Tagged()
    step_fn = torch.compile(model, backend=compiler, dynamic=False) if compiled else model
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = iter(torch.utils.data.DataLoader(Sleepy(), batch_size=16, num_workers=0))
    path = Path(tempfile.mkdtemp()) / "checkpoint.pt"
    seen = set()
    for step in range(steps):
        x, y = timed("data", next, loader)
        tag = tags.get(step, 0)
        start = time.perf_counter()
        loss = torch.nn.functional.mse_loss(step_fn(x, tag), y)
        loss.backward()
        if compiled and tag not in seen and getattr(local, "main", False):
            clocks["compile_calls"] += time.perf_counter() - start
        seen.add(tag)
        optimizer.step()
        optimizer.zero_grad()
        if step % checkpoint_every == checkpoint_every - 1:
            timed("checkpoint", torch.save, model.state_dict(), path)


result: dict = {}
local.main = True
if case == "two_trainers":
    # Without AOT autograd: torch's own bookkeeping of lazy backward compilations is not safe on two threads at once.
    other = threading.Thread(target=train, args=(24, {5: 3, 11: 2, 17: 1}), kwargs={"compiler": sleepy_compiler})
    train(1, {}, compiler=sleepy_compiler)  # the main thread steps first: its time is the one served
    other.start()
    train(24, {6: 3, 12: 2}, compiler=sleepy_compiler)
    other.join()
    served = exported()
    time.sleep(1.0)  # idle: nothing may grow by itself
    result["idle_growth"] = {phase: exported()[phase] - seconds for phase, seconds in served.items()}
elif case == "evaluator":
    # The training thread's backward graph compiles (lazily, at its first backward) while an evaluation thread's own
    # compilation is open: dynamo's callbacks, run only at the first start and the last end of all threads, tell
    # neither of the training thread's start and end.
    evaluating, trained = threading.Event(), threading.Event()

    def held_compiler(graph: torch.fx.GraphModule, example_inputs: list) -> object:
        evaluating.set()
        trained.wait(timeout=60)
        return graph.forward

    def evaluate() -> None:
        with torch.no_grad():
            torch.compile(torch.nn.Linear(8, 2), backend=held_compiler)(torch.randn(2, 8))

    train(1, {}, compiled=False)  # the main thread trains
    model = Tagged()
    step_fn = torch.compile(model, backend=backend, dynamic=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(4, 8), torch.randn(4, 2)
    start = time.perf_counter()
    loss = torch.nn.functional.mse_loss(step_fn(x), y)  # the forward compiles; the backward is left for later
    clocks["compile_calls"] += time.perf_counter() - start
    evaluator = threading.Thread(target=evaluate)
    evaluator.start()
    evaluating.wait(timeout=60)
    start = time.perf_counter()
    loss.backward()  # compiles the backward graph, inside the evaluator's compilation
    result["backward"] = time.perf_counter() - start
    clocks["compile_calls"] += result["backward"]
    trained.set()
    evaluator.join()
    optimizer.step()
    result["compilers_run"] = round(clocks["compile"] / COMPILE_SECONDS)
elif case == "openxla":
    import torch_xla

    device = torch_xla.device()
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 4)).to(device)
    step_fn = torch.compile(model, backend="openxla")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    backwards = []
    for _ in range(6):
        x, y = torch.randn(8, 64).to(device), torch.randn(8, 4).to(device)
        loss = torch.nn.functional.mse_loss(step_fn(x), y)
        start = time.perf_counter()
        loss.backward()  # the first one compiles the backward graph, on autograd's thread
        backwards.append(time.perf_counter() - start)
        optimizer.step()
        optimizer.zero_grad()
        torch_xla.sync()
    import torch_xla.debug.metrics as met

    result["first_backward"] = backwards[0]
    result["xla_compile_seconds"] = (met.metric_data("CompileTime") or (0, 0.0))[1] / 1e9
elif case == "reattach":
    train(8, {}, compiled=False)
    handle.detach()
    result["at_detach"] = exported()
    time.sleep(0.5)
    handle = neuron_exporter.attach(port=0, addr="127.0.0.1", spool_dir=tempfile.mkdtemp(), node_view=False)
    result["after_attach"] = exported()
    train(8, {}, compiled=False)
result["exported"] = exported()
result["clocks"] = clocks
handle.detach()
print(json.dumps(result), flush=True)
