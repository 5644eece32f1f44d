"""What counting FLOPs costs (``training/throughput/graph_flops.py``, ``sampled_flops.py``), on the CPU:

- a batch of a shape already counted: its signature and the look-up, per batch (the steady state of eager devices and
  torch_xla);
- a call of a compiled graph: the counting wrapper, per call (the steady state of torch.compile), for a static and a
  dynamic graph;
- counting a new compiled graph: the fake-tensor run, forward and backward, per graph, inside its compilation;
- the sampled batch: its forward and backward under the counting dispatch mode, against the same work without it;
- with --xla, instead, the sampled step on torch_xla's CPU device (forward, backward, the optimizer's step and the step
  marker, which runs the step's graph from the cache), against the same step without the mode; it checks that the
  sampled step compiles nothing.

Each figure is the median of --rounds rounds, with the interquartile range.

    python benchmarks/flops_overhead.py [--rounds 30] [--xla]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from neuron_exporter.training.throughput import graph_flops
from neuron_exporter.training.throughput.sampled_flops import SampledFlops, _counting_mode

VOCABULARY, WIDTH, HIDDEN, SEQUENCE, BATCH = 512, 64, 256, 64, 8


def model() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Embedding(VOCABULARY, WIDTH),
        torch.nn.Linear(WIDTH, HIDDEN),
        torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, VOCABULARY),
    )


def spread(values: list[float], unit: float, name: str) -> str:
    q = statistics.quantiles(values, n=4)
    return f"{statistics.median(values) / unit:9.3f} {name} (IQR {q[0] / unit:.3f} to {q[2] / unit:.3f})"


def per_call(function, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        function()
    return (time.perf_counter() - start) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--xla", action="store_true", help="the sampled step on torch_xla's CPU device too")
    args = parser.parse_args()
    torch.manual_seed(0)
    ids = torch.randint(0, VOCABULARY, (BATCH, SEQUENCE))
    if args.xla:
        xla_step(args.rounds, ids)
        return
    net = model()
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}

    flops = SampledFlops(lambda error: None, eager=lambda: True)
    flops.optimizer_stepped()
    flops.fetched(batch)
    flops.fetching()  # the shape is known now
    known = [per_call(lambda: (flops.fetching(), flops.fetched(batch)), 10_000) for _ in range(args.rounds)]
    print("a batch of a known shape:      " + spread(known, 1e-6, "µs"))

    def work() -> None:
        net(ids).sum().backward()

    bare, sampled = [], []
    for _ in range(args.rounds):
        bare.append(per_call(work, 1))
        mode = _counting_mode()
        with mode:
            sampled.append(per_call(work, 1))
    ratios = [s / b for s, b in zip(sampled, bare, strict=True)]
    print("a batch's work, bare:          " + spread(bare, 1e-3, "ms"))
    print("the same work, sampled:        " + spread(ratios, 1, "x the bare work"))

    counted: list[float] = []
    calls: dict[str, list[float]] = {"static": [], "dynamic": []}
    original = graph_flops.flops_of

    def timed_flops_of(gm, example_inputs):
        start = time.perf_counter()
        try:
            return original(gm, example_inputs)
        finally:
            counted.append(time.perf_counter() - start)

    graph_flops.flops_of = timed_flops_of
    from torch._dynamo import output_graph

    counts = graph_flops.GraphFlops(lambda error: None)
    output_graph.OutputGraph.call_user_compiler = counts.wrap(output_graph.OutputGraph.call_user_compiler)
    compiled = torch.compile(net)
    for size in (BATCH, BATCH - 3):  # static, then dynamic in the batch
        compiled(torch.randint(0, VOCABULARY, (size, SEQUENCE))).sum().backward()
    print("counting a new graph:          " + ", ".join(f"{seconds * 1e3:.0f} ms" for seconds in counted))
    graphs = {"static": counts._graphs[0], "dynamic": counts._graphs[1]}
    for name, graph in graphs.items():
        inner = graph._compiled
        arguments = (torch.zeros(1),) if name == "static" else (torch.zeros(1), 5, torch.zeros(5, SEQUENCE))
        graph._compiled = lambda *a, **k: None  # the wrapper alone
        for _ in range(args.rounds):
            calls[name].append(per_call(lambda g=graph, a=arguments: g.call(*a), 10_000))
        graph._compiled = inner
        print(f"a call of a {name} graph:" + " " * (15 - len(name)) + spread(calls[name], 1e-6, "µs"))


def xla_step(rounds: int, ids: torch.Tensor) -> None:
    import torch_xla
    import torch_xla.debug.metrics as met

    device = torch_xla.device()
    torch.manual_seed(0)
    net = model().to(device)
    optimizer = torch.optim.AdamW(net.parameters())
    on_device = ids.to(device)

    def step() -> None:
        optimizer.zero_grad()
        net(on_device).sum().backward()
        optimizer.step()
        torch_xla.sync()

    for _ in range(3):  # compiles the step's graphs, then finds them in the cache
        step()
    torch_xla._XLAC._xla_wait_device_ops(devices=[])
    compiled = met.counter_value("UncachedCompile")
    (parameter, *_) = net.parameters()
    functional = torch._C._dispatch_keys(parameter).has(torch._C.DispatchKey.Functionalize)
    bare, sampled = [], []
    for _ in range(rounds):
        bare.append(per_call(step, 1))
        with _counting_mode("xla" if functional else None):
            sampled.append(per_call(step, 1))
    torch_xla._XLAC._xla_wait_device_ops(devices=[])
    assert met.counter_value("UncachedCompile") == compiled, "the sampled step compiled a graph"
    ratios = [s / b for s, b in zip(sampled, bare, strict=True)]
    print("torch_xla's step, bare:        " + spread(bare, 1e-3, "ms"))
    print("the same step, sampled:        " + spread(ratios, 1, "x the bare step (no compilation)"))


if __name__ == "__main__":
    main()
