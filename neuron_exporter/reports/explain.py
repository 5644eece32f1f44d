"""A plain-language diagnosis of a Snapshot: what slows the training loop down, and what to do next.

It looks for the four things a ``metrics_report()`` reader looks for by eye: operators that fall back
to the CPU (``aten::`` counters), host reads inside the step (``.item()``, print), steps that run as
several graphs (graph fragmentation), and graphs compiled again and again (changing shapes).
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass, field

from ..snapshot import Snapshot
from ..snapshot_metrics import HOST_SCALAR_READ_OP

WIDTH = 100
HOST_READS_PER_STEP = 0.5  # torch_xla's own analyzer (PT_XLA_DEBUG) warns above this too
EXTRA_GRAPHS_ALLOWED = 1  # one graph outside the loop (a first .to(device), an evaluation) is not fragmentation
MIN_RECOMPILES = 2
RECOMPILES_PER_STEP = 0.1

# Older (XRT) reports name the device-to-host copy differently.
HOST_READ_METRICS = ("TransferFromDeviceTime", "TransferFromServerTime")
EXECUTE_METRICS = ("ExecuteTime", "ExecuteReplicatedTime")


@dataclass
class Finding:
    title: str
    details: list[str] = field(default_factory=list)
    next_steps: list[str] = field(default_factory=list)


@dataclass
class _Figures:
    """The figures every finding works from."""

    steps: int
    compiles: int
    cache_hits: int
    executions: int
    compile_seconds: float
    execute_seconds: float
    host_reads: int
    scalar_reads: int
    fallback: list[tuple[str, int]]

    @property
    def graphs(self) -> int:
        return self.compiles + self.cache_hits

    def per_step(self, count: float) -> str:
        return f"{count / self.steps:.1f} per step" if self.steps else "no MarkStep counter, so no per-step figure"


def _figures(snapshot: Snapshot) -> _Figures:
    executions = sum(snapshot.metric(name).total_samples for name in EXECUTE_METRICS)
    fallback = [(name, value) for name, value in snapshot.counters.items()
                if name.startswith("aten::") and name != HOST_SCALAR_READ_OP and value > 0]
    return _Figures(
        steps=snapshot.counter("MarkStep"),
        compiles=snapshot.counter("UncachedCompile"),
        cache_hits=snapshot.counter("CachedCompile"),
        executions=executions or snapshot.counter("ExecuteComputation"),
        compile_seconds=snapshot.metric("CompileTime").accumulator,
        execute_seconds=sum(snapshot.metric(name).accumulator for name in EXECUTE_METRICS),
        host_reads=sum(snapshot.metric(name).total_samples for name in HOST_READ_METRICS),
        scalar_reads=snapshot.counter(HOST_SCALAR_READ_OP),
        fallback=sorted(fallback, key=lambda item: (-item[1], item[0])),
    )


def _overview(f: _Figures) -> list[str]:
    busy = f.compile_seconds + f.execute_seconds
    share = f" ({100 * f.compile_seconds / busy:.0f}% of compile + execute time)" if busy > 0 else ""
    calls = sum(count for _, count in f.fallback)
    return [
        f"  steps (MarkStep):        {f.steps}",
        f"  graphs run:              {f.graphs} ({f.compiles} compiled, {f.cache_hits} from the compile cache); "
        f"{f.per_step(f.graphs)}",
        f"  graph executions:        {f.executions}, {f.execute_seconds:.3f} s executing",
        f"  compilations:            {f.compiles}, {f.compile_seconds:.3f} s compiling{share}",
        f"  host reads:              {f.host_reads} device-to-host transfers ({f.per_step(f.host_reads)}), "
        f"{f.scalar_reads} of them .item()",
        f"  CPU fallback operators:  {_count(len(f.fallback), 'operator')}, {_count(calls, 'call')}",
    ]


def _fallback(f: _Figures) -> Finding | None:
    if not f.fallback:
        return None
    width = max(len(name) for name, _ in f.fallback)
    details = [f"  {name:<{width}}  {count:>8}  ({f.per_step(count)})" for name, count in f.fallback]
    details.append("These operators have no XLA lowering, so they run on the CPU. Each call cuts the graph: the "
                   "pending graph runs, its tensors are copied to the host, the operator runs there and its result "
                   "is copied back (graph fragmentation), which can slow down the entire execution.")
    return Finding(
        f"CPU fallback: {_count(len(f.fallback), 'operator')} without an XLA lowering ran on the CPU",
        details,
        ["Replace each operator with an equivalent made of supported operators, or move it out of the training "
         "step (compute it on CPU tensors before .to(device), or once instead of every step).",
         "List the operators your model uses, and which ones are unsupported, with: "
         "neuron_parallel_compile --command analyze python <your training script>",
         "If you need an operator that has no lowering, create a request for operator support with the aten:: "
         "name above."],
    )


def _host_reads(f: _Figures) -> Finding | None:
    too_many = f.host_reads / f.steps > HOST_READS_PER_STEP if f.steps else f.scalar_reads > 0
    if not too_many:
        return None
    details = [f"{f.host_reads} device-to-host transfers in {f.steps} steps ({f.per_step(f.host_reads)})."]
    if f.scalar_reads:
        details.append(f"{f.scalar_reads} of them are .item() calls ({HOST_SCALAR_READ_OP}: "
                       f"{f.per_step(f.scalar_reads)}).")
    other = f.host_reads - f.scalar_reads
    if other > 0:
        source = "the CPU fallback operators above, " if f.fallback else ""
        details.append(f"{other} come from {source}print of a device tensor, .cpu() or .tolist().")
    details.append("A read in the middle of a step makes the host wait for the device and cuts the step's graph "
                   "in two.")
    return Finding(
        "Host reads inside the step: the host waits for device values",
        details,
        ["Read values after the step has ended: call loss.item() or print after torch_xla.sync() "
         "(xm.mark_step()), and only every N steps; or hand the tensors to xm.add_step_closure() so they are "
         "read once the step's graph has run."],
    )


def _fragmentation(f: _Figures) -> Finding | None:
    if not f.steps or f.graphs <= f.steps + EXTRA_GRAPHS_ALLOWED:
        return None
    causes = []
    if f.fallback:
        causes.append("CPU fallback operators")
    if f.scalar_reads:
        causes.append(".item() calls")
    cause = ("The " + " and the ".join(causes) + " above cut the graph." if causes else
             "Something cuts the graph: a print, .item(), .cpu() or .tolist() of a device tensor, or Python "
             "control flow on a tensor's value.")
    return Finding(
        f"Graph fragmentation: {f.graphs / f.steps:.1f} graphs per step ({f.graphs} graphs in {f.steps} steps)",
        ["Each step should run as one graph, ended by torch_xla.sync() (xm.mark_step()); a step cut into several "
         "graphs runs them one after the other and waits on the host in between.", cause],
        ["Remove the graph cuts so that the whole step is traced into one graph.",
         "To see the Python line that made each graph, run once with PT_XLA_DEBUG_LEVEL=1: every compilation "
         "then prints its cause and the frame that triggered it."],
    )


def _recompiles(f: _Figures) -> Finding | None:
    if not f.steps:
        return None
    distinct_graphs = math.ceil(f.graphs / f.steps)  # graphs a steady step needs compiled once
    recompiles = f.compiles - distinct_graphs
    if recompiles < max(MIN_RECOMPILES, RECOMPILES_PER_STEP * f.steps):
        return None
    busy = f.compile_seconds + f.execute_seconds
    share = f"{100 * f.compile_seconds / busy:.0f}%" if busy > 0 else "most"
    return Finding(
        f"Recompilation: {f.compiles} compilations for {f.steps} steps ({f.per_step(f.compiles)})",
        [f"{f.cache_hits or 'None'} of the {f.graphs} graphs came from the compile cache; compiling took "
         f"{f.compile_seconds:.3f} s, {share} of compile + execute time.",
         "A graph is compiled again whenever its shapes change: input shapes that vary from step to step (last "
         "partial batch, variable sequence length), or Python numbers that change every step and are baked into "
         "the graph."],
        ["Pad inputs to one fixed shape, or to a few bucket sizes (e.g. sequence lengths rounded up to a multiple "
         "of 64); drop the last partial batch (DataLoader(..., drop_last=True)).",
         "Pass values that change every step (learning rate, step count) as device tensors, not Python numbers.",
         "If the model runs under torch.compile, mark the changing dimension dynamic "
         "(torch._dynamo.mark_dynamic).",
         "Compiled graphs are kept in the Neuron persistent cache, so a second run reuses them; "
         "neuron_parallel_compile compiles them all ahead of time."],
    )


def findings(snapshot: Snapshot) -> list[Finding]:
    """Every problem the snapshot shows, most harmful first."""
    f = _figures(snapshot)
    return [found for check in (_fallback, _host_reads, _fragmentation, _recompiles) if (found := check(f))]


def explain(snapshot: Snapshot) -> str:
    """The diagnosis as text: an overview of the figures, then each finding with what to do next."""
    f = _figures(snapshot)
    lines = ["Overview", *_overview(f), ""]
    found = findings(snapshot)
    if not found:
        if f.steps:
            lines.append(_wrap("Nothing wrong found: no CPU fallback operator, no host read inside the step, one "
                               "graph per step, no recompilation after the first compile.", ""))
        else:
            lines.append(_wrap("Nothing wrong found: no CPU fallback operator and no .item() call. The report has "
                               "no MarkStep counter, so the per-step checks (graphs, host reads, recompiles) could "
                               "not run.", ""))
        return "\n".join(lines) + "\n"
    lines.append(f"Findings ({len(found)})")
    for number, finding in enumerate(found, 1):
        lines += ["", f"{number}. {finding.title}"]
        lines += [_wrap(detail, "   ") for detail in finding.details]
        lines.append("   What to do next:")
        lines += [_wrap(step, "   - ", "     ") for step in finding.next_steps]
    return "\n".join(lines) + "\n"


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" + ("" if number == 1 else "s")


def _wrap(text: str, first: str, rest: str | None = None) -> str:
    if text.startswith("  "):  # a table row: keep it as it is
        return first + text
    return textwrap.fill(text, WIDTH, initial_indent=first, subsequent_indent=rest or first,
                         break_long_words=False, break_on_hyphens=False)
