"""The problems a torch_xla metrics report shows, each a ``Finding`` with what to do next: operators that fall back
to the CPU (``aten::``, ``torchvision::`` or any other namespace's counters but ``xla::``), host reads
(``.item()``, print), steps that run as several graphs (graph fragmentation), and compilations that go on after
the first steps (changing shapes, or new graphs), judged by the alerts' thresholds (``neuron_exporter.thresholds``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .. import thresholds
from ..snapshot import Snapshot
from ..snapshot_metrics import EXECUTE_METRICS, HOST_SCALAR_READ_OP, is_cpu_fallback_op
from .step_count import StepCount, SyncHistory, compilations, graphs_run, plural, step_count

HOST_READS_PER_STEP = thresholds.HOST_READS_PER_STEP
LATE_COMPILES_PER_STEP = thresholds.RECOMPILATIONS_PER_STEP
EXTRA_GRAPHS_ALLOWED = 1  # one graph outside the loop (a first .to(device), an evaluation) is not fragmentation
MIN_LATE_COMPILES = 2

# Older (XRT) reports name the device-to-host copy differently.
HOST_READ_METRICS = ("TransferFromDeviceTime", "TransferFromServerTime")
# What met.short_metrics_report() holds by default, besides every aten:: counter.
SHORT_REPORT_COUNTERS = frozenset({"CachedCompile", "MarkStep", "DynamoSyncInputExecuteTime"})


@dataclass
class Finding:
    title: str
    details: list[str] = field(default_factory=list)
    next_steps: list[str] = field(default_factory=list)


@dataclass
class Figures:
    """The figures every finding works from."""

    markers: int
    compiles: int
    cache_hits: int
    graphs: int
    executions: int
    compile_seconds: float
    execute_seconds: float
    host_reads: int
    scalar_reads: int
    fallback: list[tuple[str, int]]
    short_report: bool
    count: StepCount
    training_steps: int | None = None  # given by the user (--steps N)

    @property
    def steps(self) -> int:
        """The divisor of every per-step figure: the training steps if given, else the markers that ran a graph."""
        return self.training_steps or self.count.steps

    @property
    def unit(self) -> str:
        return "step" if self.training_steps else "step marker"

    @property
    def fallback_copies(self) -> int:
        """Host reads taken as copies of the fallback operators' inputs: at most one per call."""
        return min(self.host_reads - self.scalar_reads, sum(count for _, count in self.fallback))

    @property
    def user_reads(self) -> int:
        """Host reads the training code made itself: .item(), print, .cpu(), ..."""
        return self.host_reads - self.fallback_copies

    def per_step(self, count: float) -> str:
        return f"{count / self.steps:.1f} per {self.unit}" if self.steps else "no per-step figure"


def figures(snapshot: Snapshot, history: SyncHistory | None, training_steps: int | None = None) -> Figures:
    executions = sum(snapshot.metric(name).total_samples for name in EXECUTE_METRICS)
    executions = executions or snapshot.counter("ExecuteComputation")
    fallback = [(name, value) for name, value in snapshot.counters.items() if is_cpu_fallback_op(name) and value > 0]
    short = bool(snapshot.counters) and all(
        name in SHORT_REPORT_COUNTERS or name.startswith("aten::") for name in snapshot.counters
    )
    graphs = graphs_run(snapshot) or executions  # executions finish asynchronously: the lookups are the surer count
    host_reads = sum(snapshot.metric(name).total_samples for name in HOST_READ_METRICS)
    markers = snapshot.counter("MarkStep")
    return Figures(
        markers=markers,
        compiles=compilations(snapshot),
        cache_hits=snapshot.counter("CachedCompile"),
        graphs=graphs,
        executions=executions,
        compile_seconds=snapshot.metric("CompileTime").accumulator,
        execute_seconds=sum(snapshot.metric(name).accumulator for name in EXECUTE_METRICS),
        host_reads=host_reads,
        scalar_reads=snapshot.counter(HOST_SCALAR_READ_OP),
        fallback=sorted(fallback, key=lambda item: (-item[1], item[0])),
        short_report=short,
        count=step_count(markers, graphs, host_reads, history),
        training_steps=training_steps,
    )


def _fallback(f: Figures, listed: set[str]) -> Finding | None:
    if not f.fallback:
        return None
    width = max(len(name) for name, _ in f.fallback)
    details = [f"  {name:<{width}}  {count:>8}  ({f.per_step(count)})" for name, count in f.fallback]
    details.append(
        "These operators have no XLA lowering, so torch_xla runs them on the CPU: each call copies its "
        "inputs to the host, first running the pending graph if they are not computed yet (a graph "
        "cut), runs the operator there and copies its result back to the device."
    )
    if any("backward" in name for name, _ in f.fallback):
        details.append("An operator named ..._backward runs when the gradient of its forward operator is computed.")
    namespaces = {name.partition("::")[0] + "::" for name, _ in f.fallback}
    others = sorted(namespaces - {"aten::"})
    return Finding(
        f"CPU fallback: {plural(len(f.fallback), 'operator')} without an XLA lowering ran on the CPU",
        details,
        [
            "Replace each operator with an equivalent made of supported operators, or move it out of the training "
            "step (compute it on CPU tensors before .to(device), or once instead of every step).",
            "On AWS Neuron, list the operators your model uses, and which ones are unsupported, with: "
            "neuron_parallel_compile --command analyze python <your training script>",
        ]
        + (
            [
                "If you need an aten:: operator that has no lowering, ask the torch_xla project (or your device's "
                "plugin) for one, naming the operator as above."
            ]
            if len(others) < len(namespaces)
            else []
        )
        + (
            [
                f"An operator of another library ({', '.join(others)}) runs on the CPU until it has an implementation "
                f"for the XLA device: one made of supported operators can be registered with torch.library."
            ]
            if others
            else []
        ),
    )


def _host_reads(f: Figures, listed: set[str]) -> Finding | None:
    too_many = f.user_reads / f.steps > HOST_READS_PER_STEP if f.steps else f.user_reads > 0
    if not too_many:
        return None
    parts = []
    if f.scalar_reads:
        parts.append(
            f"{f.scalar_reads} are .item() calls ({HOST_SCALAR_READ_OP}; also float(), int() or bool() of "
            f"a one-element tensor, as in `if tensor:`)"
        )
    if f.fallback_copies:
        parts.append(
            f"{f.fallback_copies} copy the inputs of the CPU fallback operators"
            f"{' above' if 'fallback' in listed else ''} (counted as at most one per call)"
        )
    other = f.host_reads - f.scalar_reads - f.fallback_copies
    if other:
        parts.append(
            f"{other} come from print of a device tensor, .cpu(), .tolist() or .numpy()"
            + (
                ", or from CPU fallback operators outside aten::, which a short report does not list"
                if f.short_report
                else ""
            )
        )
    details = [f"Of the {f.host_reads} device-to-host transfers, " + _join(parts) + "."]
    details.append(
        "Each read makes the host wait for the device. A read before the step's end also cuts the "
        "step's graph: what the step computed so far runs as a graph of its own. A read after the "
        "step's end only waits for the copy."
    )
    return Finding(
        f"Host reads: the host read device values {f.user_reads} times ({f.per_step(f.user_reads)})",
        details,
        [
            "Read values after the step has ended: call loss.item() or print after torch_xla.sync() "
            "(xm.mark_step()), and only every N steps; or hand the tensors to xm.add_step_closure() so they are "
            "read once the step's graph has run."
        ],
    )


def _fragmentation(f: Figures, listed: set[str]) -> Finding | None:
    if not f.steps or f.graphs <= f.steps + EXTRA_GRAPHS_ALLOWED:
        return None
    causes = []
    if f.fallback:
        causes.append("the CPU fallback operators" + (" above" if "fallback" in listed else ""))
    if f.scalar_reads:
        causes.append(".item() calls")
    if f.user_reads > f.scalar_reads:
        causes.append("other host reads (print, .cpu(), .tolist())")
    if causes:
        cause = f"The report has {_join(causes)}: each cuts the graph when it needs a value before the step's end."
    else:
        cause = (
            "The report has no host read, so no .item(), print or CPU fallback operator cut these graphs: "
            "they ran neither at a step's end nor for a host read."
        )
    details = [
        "A step should run as one graph, ended by its step marker (torch_xla.sync(), xm.mark_step()); a "
        "step cut into several graphs runs them one after the other, and the host waits in between.",
        cause,
    ]
    if f.count.alternative is not None and f.count.alternative > f.steps:
        details.append(
            f"If some host reads came after their step had ended, there were more steps (up to "
            f"{f.count.alternative}) and fewer graphs per step: see Steps."
        )
    return Finding(
        f"Graph fragmentation: {f.graphs / f.steps:.1f} graphs per {f.unit} ({f.graphs} graphs in "
        f"{plural(f.steps, f.unit)})",
        details,
        [
            "Remove the graph cuts so that the whole step is traced into one graph: read values after the step's "
            "end, and replace CPU fallback operators.",
            "To see the Python line that made each graph, run once with PT_XLA_DEBUG_LEVEL=1: every compilation "
            "then prints its cause and the frame that triggered it.",
        ],
    )


def _late_compiles(f: Figures, listed: set[str]) -> Finding | None:
    if not f.steps:
        return None
    graphs_per_step = math.ceil(f.graphs / f.steps)  # the graphs a step runs, each compiled when first run
    late = f.compiles - graphs_per_step
    if late < max(MIN_LATE_COMPILES, LATE_COMPILES_PER_STEP * f.steps):
        return None
    busy = f.compile_seconds + f.execute_seconds
    share = f"{100 * f.compile_seconds / busy:.0f}%" if busy > 0 else "most"
    return Finding(
        f"Compilations after the first steps: {late} ({f.compiles} compilations in {plural(f.steps, f.unit)})",
        [
            f"At {f.graphs / f.steps:.1f} graphs per {f.unit}, the first steps need about "
            f"{plural(graphs_per_step, 'compilation')}; the other {late} came later. Compiling took "
            f"{f.compile_seconds:.3f} s, {share} of compile + execute time; {f.cache_hits} of the {f.graphs} graphs "
            f"came from the compile cache.",
            "A report counts compilations but cannot say why a graph was compiled. Either the same code ran with "
            "new shapes (a recompilation: input shapes that vary, such as a last partial batch or variable sequence "
            "lengths, or Python numbers that change every step and are part of the graph), or code ran that had not "
            "run before (a new graph: an evaluation loop, a logging or checkpointing step, a change of learning "
            "rate, or the optimizer's state appearing at its first step).",
        ],
        [
            "Find out which: run once with PT_XLA_DEBUG_LEVEL=1. Every compilation then prints its cause, its graph "
            "hash and the Python frames that triggered it: the same frames with a new hash are a recompilation, "
            "new frames a new graph.",
            "For shapes that change: pad inputs to one fixed shape, or to a few bucket sizes (e.g. sequence lengths "
            "rounded up to a multiple of 64); drop the last partial batch (DataLoader(..., drop_last=True)); pass "
            "values that change every step (learning rate, step count) as device tensors, not Python numbers; "
            "under torch.compile, mark the changing dimension dynamic (torch._dynamo.mark_dynamic).",
            "For new graphs: each kind of step compiles its graphs once, so these compilations stop once every kind "
            "of step (training, evaluation, logging) has run. If they keep growing with the steps, something in "
            "the step changes the graph every time.",
            "Keep compiled graphs from one run to the next: torch_xla.runtime.initialize_cache(path) on any "
            "device; on AWS Neuron the compile cache does it, and neuron_parallel_compile compiles the graphs "
            "ahead of time.",
        ],
    )


CHECKS = (
    ("fallback", _fallback),
    ("host_reads", _host_reads),
    ("fragmentation", _fragmentation),
    ("late_compiles", _late_compiles),
)


def findings_of(f: Figures) -> list[Finding]:
    found: list[Finding] = []
    listed: set[str] = set()
    for name, check in CHECKS:
        finding = check(f, listed)
        if finding:
            found.append(finding)
            listed.add(name)
    return found


def findings(
    snapshot: Snapshot, history: SyncHistory | None = None, training_steps: int | None = None
) -> list[Finding]:
    """Every problem the snapshot shows, most harmful first."""
    return findings_of(figures(snapshot, history, training_steps))


def _join(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
