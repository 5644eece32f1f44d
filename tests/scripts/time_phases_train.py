"""A training loop whose phases it times itself, to hold ``training_time_seconds_total{phase}`` against.

Usage: python time_phases_train.py BACKEND [--steps 16] [--data-sleep 0.02]

BACKEND is ``xla`` (torch_xla on its CPU device), ``inductor`` (``torch.compile`` on the CPU) or ``neuron`` (the
emulated TorchNeuron device, eager). The script attaches, then: saves and loads a checkpoint before training; makes
its optimizer; trains STEPS steps from a DataLoader whose Dataset sleeps DATA_SLEEP per sample (4 per batch), with a
timed ``.item()`` every step (a host read on a device) and, where the backend compiles, a new input shape at two
steps (recompilations); saves a checkpoint after training; detaches. It prints one JSON line: its own clocks per
phase, the exporter's totals after ``detach()``, and the wall time from the process's start to the end of
``detach()`` and to its start.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import psutil

parser = argparse.ArgumentParser()
parser.add_argument("backend", choices=("xla", "inductor", "neuron"))
parser.add_argument("--steps", type=int, default=16)
parser.add_argument("--data-sleep", type=float, default=0.02)
args = parser.parse_args()
process_start = time.perf_counter() - (time.time() - psutil.Process().create_time())
if args.backend == "neuron":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support" / "torchneuron"))

import neuron_exporter  # noqa: E402

handle = neuron_exporter.attach(port=0, addr="127.0.0.1", spool_dir=tempfile.mkdtemp(), node_view=False)

import torch  # noqa: E402
from prometheus_client import generate_latest  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

clocks = {"checkpoint": 0.0, "data": 0.0, "host_sync": 0.0, "compile": 0.0}


def timed(phase: str, function, *call_args, **kwargs):
    start = time.perf_counter()
    try:
        return function(*call_args, **kwargs)
    finally:
        clocks[phase] += time.perf_counter() - start


if args.backend == "xla":
    import torch_xla
    import torch_xla.debug.metrics as met

    device = torch_xla.device()
    compile_ns_before = (met.metric_data("CompileTime") or (0, 0.0))[1]
elif args.backend == "neuron":
    import torch_neuronx

    device = torch.device("neuron")
else:
    device = torch.device("cpu")


class Sleepy(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 10_000

    def __getitem__(self, index: int):
        time.sleep(args.data_sleep)
        return torch.randn(16), torch.randn(4)


torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
checkpoint = Path(tempfile.mkdtemp()) / "checkpoint.pt"
big = {"model": model.state_dict(), "ballast": torch.randn(8_000_000)}  # 32 MB: a save and a load worth timing
timed("checkpoint", torch.save, big, checkpoint)
model.load_state_dict(timed("checkpoint", torch.load, checkpoint)["model"])
model = model.to(device)
step_fn = model
compile_calls: list[float] = []
plain_calls: list[float] = []
if args.backend == "inductor":
    step_fn = torch.compile(model, backend="inductor", dynamic=False)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
first_step: dict = {}  # when the first optimizer step ended (start-up ends there), and the clocks then
loader = iter(torch.utils.data.DataLoader(Sleepy(), batch_size=4, num_workers=0))
shapes_at = {args.steps // 3: 3, 2 * args.steps // 3: 2}  # steps whose batch is cut: a new shape, a recompilation
for step in range(args.steps):
    x, y = timed("data", next, loader)
    rows = shapes_at.get(step, 4)
    x, y = x[:rows].to(device), y[:rows].to(device)
    start = time.perf_counter()
    loss = torch.nn.functional.mse_loss(step_fn(x), y)
    loss.backward()  # with inductor, its first call at a shape compiles the backward graph
    if args.backend == "inductor":
        (compile_calls if step in shapes_at or step == 0 else plain_calls).append(time.perf_counter() - start)
    optimizer.step()
    if step == 0:
        first_step = {"at": time.perf_counter(), "clocks": dict(clocks)}
        if args.backend == "xla":
            first_step["compile"] = ((met.metric_data("CompileTime") or (0, 0.0))[1] - compile_ns_before) / 1e9
        elif args.backend == "neuron":
            first_step["compile"] = torch_neuronx._C._get_compilation_cache_stats()["total_compilation_time_ms"] / 1000
    optimizer.zero_grad()
    if args.backend == "xla":
        torch_xla.sync()
    if args.backend != "inductor":
        timed("host_sync", loss.item)  # on XLA, runs no graph: the step's ran at the sync
last_step = time.perf_counter()
state = model.state_dict()
if args.backend == "neuron":  # the emulated device's tensors do not serialize: copied to the host first
    state = timed("host_sync", lambda: {name: tensor.cpu() for name, tensor in state.items()})
timed("checkpoint", torch.save, {"model": state}, checkpoint)
if args.backend == "xla":
    clocks["compile"] = ((met.metric_data("CompileTime") or (0, 0.0))[1] - compile_ns_before) / 1e9
elif args.backend == "neuron":  # the stand-in's compile cache, as TorchNeuron's own account has it
    clocks["compile"] = torch_neuronx._C._get_compilation_cache_stats()["total_compilation_time_ms"] / 1000
elif args.backend == "inductor":
    typical = sorted(plain_calls)[len(plain_calls) // 2]
    clocks["compile"] = sum(t - typical for t in compile_calls)
    first_step["compile"] = compile_calls[0] - typical
from neuron_exporter.diagnosis import render_text  # noqa: E402

diagnosis = render_text(handle.diagnosis())


def exported_now() -> dict[str, float]:
    return {
        sample.labels["phase"]: sample.value
        for family in text_string_to_metric_families(generate_latest(handle._rank_registry).decode())
        if family.name == "training_time_seconds"
        for sample in family.samples
        if sample.name == "training_time_seconds_total"
    }


before_detach = exported_now()
detach_start = time.perf_counter()
handle.detach()
detach_end = time.perf_counter()
exported = exported_now()
print(
    json.dumps(
        {
            "clocks": clocks,
            "exported": exported,
            "before_detach": before_detach,
            "wall_to_detach_start": detach_start - process_start,
            "wall_to_detach_end": detach_end - process_start,
            # start-up: to the end of the first optimizer step, less the phases timed in it
            "startup": first_step["at"] - process_start - sum(first_step["clocks"].values()) - first_step["compile"],
            "after_last_step": detach_start - last_step,
            "pid": os.getpid(),
            "diagnosis": diagnosis,
        }
    ),
    flush=True,
)
