"""Whether attach() keeps memory across ``torch._dynamo.reset()``: loops of reset and recompile of a module compiled
with ``torch.compile(backend="neuron")`` on TorchNeuron's ``neuron`` device (emulated on the CPU by
tests/support/torchneuron: torch 2.13+, e.g. .venv-torch-latest-3.13), bare and attached, each in a fresh process.

    python benchmarks/dynamo_reset_memory.py [--loops 40] [--warmup 35]

Each process trains a few compiled steps, runs --warmup loops (dynamo's ring of 64 compilation records, two a loop,
and the allocator's caches fill), then --loops loops of: ``torch._dynamo.reset()``, one compiled forward and
backward (a new compilation, both graphs), an optimizer step and, attached, a scrape of its own endpoint. Prints per
variant the resident memory growth over the loops (after a garbage collection), and what is still alive at the end
of dynamo's compilations (graph modules, compilation records). A third process, attached under tracemalloc, lists
the allocations made during the loops, still alive at the end, whose stack passes through neuron_exporter, and the
exporter's objects by class and the entries of their containers, before and after the loops: what attach() keeps
is there, whatever the resident memory's noise.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import tracemalloc
import urllib.request
import weakref
from collections import Counter, deque
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = ("bare", "attached", "traced")


def rss_mib() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def exporter_objects() -> Counter:
    """Live objects of neuron_exporter's classes, by class, and the entries of the containers they hold, by class and
    attribute (after a collection)."""
    gc.collect()
    counts: Counter = Counter()
    for o in gc.get_objects():
        module = getattr(type(o), "__module__", None)
        if not (isinstance(module, str) and module.startswith("neuron_exporter")):
            continue
        name = type(o).__qualname__
        counts[name] += 1
        for attribute, value in getattr(o, "__dict__", {}).items():
            if isinstance(value, (dict, list, set, tuple, deque, weakref.WeakSet, weakref.WeakValueDictionary)):
                counts[f"{name}.{attribute} entries"] += len(value)
    return counts


def ours_by_line() -> dict[str, tuple[int, int]]:
    """Traced allocations alive now whose stack passes through neuron_exporter, by the innermost line of the exporter
    that made them and the line that allocated: {"file:line (file:line)": (blocks, bytes)} (after a collection)."""
    gc.collect()
    snapshot = tracemalloc.take_snapshot()
    ours = snapshot.filter_traces([tracemalloc.Filter(True, "*/neuron_exporter/*", all_frames=True)])
    found: dict[str, tuple[int, int]] = {}
    for trace in ours.traces:
        frames = list(trace.traceback)[::-1]  # the most recent first
        frame = next(f for f in frames if "/neuron_exporter/" in f.filename)
        where = f"{frame.filename.split('/neuron_exporter/')[-1]}:{frame.lineno}"
        made = frames[0]
        if made is not frame:
            where += f" ({'/'.join(made.filename.split('/')[-2:])}:{made.lineno})"
        blocks, size = found.get(where, (0, 0))
        found[where] = (blocks + 1, size + trace.size)
    return found


def dynamo_objects() -> dict[str, int]:
    """Live objects a compilation leaves: graph modules, compilation records, code objects (after a collection)."""
    import torch

    gc.collect()
    counts = {"graph_modules": 0, "compilation_records": 0}
    records = torch._dynamo.utils.CompilationMetrics
    for o in gc.get_objects():
        if isinstance(o, torch.fx.GraphModule):
            counts["graph_modules"] += 1
        elif isinstance(o, records):
            counts["compilation_records"] += 1
    return counts


def child(variant: str, loops: int, warmup: int) -> dict:
    sys.path.insert(0, str(ROOT / "tests" / "support" / "torchneuron"))
    url = None
    if variant != "bare":
        import neuron_exporter

        handle = neuron_exporter.attach(port=0, addr="127.0.0.1", spool_dir=tempfile.mkdtemp(), node_view=False)
        url = handle.url
    import torch
    import torch_neuronx  # noqa: F401 (the neuron device and backend)

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)).to("neuron")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    compiled = torch.compile(model, backend="neuron")
    x = torch.randn(32, 64).to("neuron")

    def loop(reset: bool = True) -> None:
        if reset:
            torch._dynamo.reset()
        compiled(x).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
        if url is not None:
            with urllib.request.urlopen(url, timeout=30) as response:
                response.read()

    for _ in range(3):
        loop(reset=False)
    for _ in range(warmup):
        loop()
    before_objects = exporter_objects() if variant == "traced" else Counter()
    if variant == "traced":
        tracemalloc.start(25)
    gc.collect()
    rss_before = rss_mib()
    half = loops // 2
    for _ in range(half):
        loop()
    middle = ours_by_line() if variant == "traced" else Counter()
    for _ in range(loops - half):
        loop()
    gc.collect()
    rss_after = rss_mib()
    result: dict = {"variant": variant, "rss_before_mib": rss_before, "rss_growth_mib": rss_after - rss_before}
    if variant == "traced":
        end = ours_by_line()
        tracemalloc.stop()
        result["ours_kib"] = sum(size for (_, size) in end.values()) / 1024
        # What the second half of the loops added: what grows per loop, not what the first loops set up once.
        result["ours_growth"] = sorted(
            ([where, *end.get(where, (0, 0))[::-1], *middle.get(where, (0, 0))[::-1]] for where in end | middle),
            key=lambda row: row[1] - row[3],
            reverse=True,
        )[:10]
        after_objects = exporter_objects()
        result["exporter_objects_growth"] = {
            name: after_objects[name] - before_objects[name]
            for name in after_objects | before_objects
            if after_objects[name] != before_objects[name]
        }
    else:
        result["dynamo_objects"] = dynamo_objects()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loops", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=35)
    parser.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.loops, args.warmup)))
        return
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    results = {}
    for variant in VARIANTS:
        done = subprocess.run(
            [sys.executable, __file__, "--child", variant, "--loops", str(args.loops), "--warmup", str(args.warmup)],
            capture_output=True,
            text=True,
            env=env,
        )
        if done.returncode != 0:
            sys.exit(f"{variant}: exit status {done.returncode}\n{done.stderr}")
        results[variant] = json.loads(done.stdout.strip().splitlines()[-1])
    import torch

    print(f"torch {torch.__version__}, Python {sys.version.split()[0]}: {args.loops} loops of reset and recompile")
    for variant in ("bare", "attached"):
        result = results[variant]
        print(
            f"{variant:>9}: RSS {result['rss_before_mib']:.0f} MiB, grew {result['rss_growth_mib']:+.1f} MiB; alive "
            + ", ".join(f"{key} {value}" for key, value in result["dynamo_objects"].items())
        )
    traced = results["traced"]
    half = args.loops - args.loops // 2
    print(
        f"attached, traced: alive at the end, allocated through neuron_exporter during the loops: "
        f"{traced['ours_kib']:.1f} KiB; the lines that added most over the last {half} loops (KiB, blocks: at the "
        f"end, at half-way):"
    )
    for where, size, blocks, middle_size, middle_blocks in traced["ours_growth"]:
        print(f"    {size / 1024:7.1f} {blocks:5d}  {middle_size / 1024:7.1f} {middle_blocks:5d}  {where}")
    growth = traced["exporter_objects_growth"]
    print("  neuron_exporter objects added over the loops:", json.dumps(growth) if growth else "none")


if __name__ == "__main__":
    main()
