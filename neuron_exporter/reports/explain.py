"""A plain-language diagnosis of a Snapshot: what slows the training loop down, and what to do next.

It looks for the four things a ``metrics_report()`` reader looks for by eye: operators that fall back
to the CPU (``aten::``, ``torchvision::`` or any other namespace's counters but ``xla::``), host reads
(``.item()``, print), steps that run as several graphs (graph fragmentation), and compilations that go on
after the first steps (changing shapes, or new graphs).

Per-step figures need a count of training steps, and a report has none: it counts step markers (``MarkStep``,
every sync, also those that ran no graph), graphs (compile cache lookups) and host reads (device-to-host
transfers), and knows nothing of optimizer steps. ``StepCount`` works out the step markers that ran a graph from
those, and says how (see ``step_count``); the figures are per such marker, unless the user gives the training
steps (``--steps N``), which are then the divisor.
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass, field

from ..snapshot import Snapshot
from ..snapshot_metrics import EXECUTE_METRICS, HOST_SCALAR_READ_OP, is_cpu_fallback_op

WIDTH = 100
HOST_READS_PER_STEP = 0.5  # torch_xla's own analyzer (PT_XLA_DEBUG) warns above this too
EXTRA_GRAPHS_ALLOWED = 1  # one graph outside the loop (a first .to(device), an evaluation) is not fragmentation
MIN_LATE_COMPILES = 2
LATE_COMPILES_PER_STEP = 0.1

# Older (XRT) reports name the device-to-host copy differently.
HOST_READ_METRICS = ("TransferFromDeviceTime", "TransferFromServerTime")
# What met.short_metrics_report() holds by default, besides every aten:: counter.
SHORT_REPORT_COUNTERS = frozenset({"CachedCompile", "MarkStep", "DynamoSyncInputExecuteTime"})

EMPTY_SYNCS = (
    "torch_xla.step() and torch_xla.compile() also sync when they start, and MpDeviceLoader before "
    "every batch and once at the end"
)
NOT_TRAINING_STEPS = (
    "A report knows nothing of optimizer steps, so the figures here are per step marker that ran "
    "a graph, not per training step: with gradient accumulation and a sync per micro-batch, each "
    "micro-batch counts, and so do evaluation or logging markers that run a graph. Give the "
    "number of training steps with --steps N for figures per training step."
)


@dataclass
class Finding:
    title: str
    details: list[str] = field(default_factory=list)
    next_steps: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class StepCount:
    """The steps the per-step figures are based on, and how they were counted."""

    steps: int  # 0: the report allows no per-step figure
    basis: str  # what was counted, in a few words
    explanation: list[str]  # how, and what else the report would allow
    alternative: int | None = None  # another step count the report allows, when it cannot tell the two apart


class SyncHistory:
    """Follows the reports of an ``XLA_METRICS_FILE`` dump, to count the syncs that ran a graph.

    torch_xla appends a report after every sync (``[MetricsData; step=N]``, N counting from 0), so a dump
    that holds a process's reports from its first sync on tells which syncs ran a graph: those whose
    report shows more graphs than the one before. A single report cannot. The count starts over where
    the dump starts over (another run appended to the same file, or counters cleared), and is left
    unused when the reports do not follow each other one sync apart (a dump cut at the front, or a
    process whose syncs were not all written).
    """

    def __init__(self) -> None:
        self.seen = 0  # reports, in all
        self.reports = 0  # of the last run in the dump
        self.complete = False  # the last run's reports start at its first sync and follow one sync apart
        self.syncs_with_graph = 0
        self._last: tuple[int, int, int] | None = None  # (step, markers, graphs) of the last report

    def add(self, step: int | None, snapshot: Snapshot) -> None:
        markers, graphs = snapshot.counter("MarkStep"), _graphs(snapshot)
        self.seen += 1
        last = self._last
        if step is None or last is None or step != last[0] + 1 or graphs < last[2]:
            # The first report of a run: it holds every graph that ran before the first sync.
            self.reports, self.syncs_with_graph = 1, int(graphs > 0)
            self.complete = step == 0 and markers == 1
        else:
            self.reports += 1
            self.syncs_with_graph += graphs > last[2]
            self.complete = self.complete and markers == last[1] + 1
        self._last = (-1 if step is None else step, markers, graphs)

    @property
    def usable(self) -> bool:
        return self.complete and self.reports > 1


def _graphs(snapshot: Snapshot) -> int:
    return snapshot.counter("CachedCompile") + _compiles(snapshot)


def _compiles(snapshot: Snapshot) -> int:
    # short_metrics_report() has no UncachedCompile; every compilation adds a CompileTime sample too.
    if "UncachedCompile" in snapshot.counters:
        return snapshot.counter("UncachedCompile")
    return snapshot.metric("CompileTime").total_samples


def step_count(markers: int, graphs: int, host_reads: int, history: SyncHistory | None = None) -> StepCount:
    """The best step count a report allows, and how it was counted.

    A graph runs when a step ends (at a step marker, which runs at most one) or before, when the host
    needs a value (a host read, which runs at most one; a read of a value already computed runs none).
    So the markers that ran a graph, the steps, number at most ``min(markers, graphs)``, and at least
    ``graphs - host_reads``. Where the two bounds differ, the report cannot tell whether the reads came
    before their step's end (each cutting a graph: fewer steps of more graphs) or after it (no graph: as
    many steps as graphs). With at least one read per step of the lower count, the reads are taken as
    cuts; otherwise as reads after the step's end. A dump with a report per sync counts the syncs that ran
    a graph (or followed a graph cut) directly.
    """
    if markers == 0:
        return StepCount(
            0,
            "no step markers",
            [
                "The report has no MarkStep counter: no step was ended with torch_xla.sync() (xm.mark_step()), or "
                "the report is of an older format. So there is no per-step figure."
            ],
        )
    if graphs == 0:
        return StepCount(
            0, "no graphs", [f"No graph ran in the {_count(markers, 'step marker')}, so there is no per-step figure."]
        )
    if history is not None and history.usable:
        steps = history.syncs_with_graph
        explanation = [
            f"{_count(steps, 'step')}: the syncs after which more graphs had run than before, counted "
            f"over the {history.reports} reports of the XLA_METRICS_FILE dump, one per sync. A sync "
            f"that follows a graph cut counts even if it ran no graph itself."
        ]
        if markers > steps:
            explanation.append(
                f"The other {markers - steps} of the {_count(markers, 'step marker')} (MarkStep) "
                f"ran no graph: {EMPTY_SYNCS}."
            )
        return StepCount(steps, "syncs that ran a graph, from the dump", explanation + [NOT_TRAINING_STEPS])

    unused = []
    if history is not None and history.seen > 1:
        unused = [
            "The reports of the XLA_METRICS_FILE dump were not used to count steps: those of its last run do "
            "not start at the first sync or skip syncs. The steps are worked out from its last report alone."
        ]
    low, high = max(graphs - host_reads, 0), min(markers, graphs)
    bounds = (
        f"A graph runs either when a step ends, at a step marker, or before, when the host needs a value "
        f"(a host read). Of the {_count(graphs, 'graph')}, at most {host_reads} ran for host reads, so at "
        f"least {low} ran at step markers; and at most {high} can have, one per marker."
    )
    alternative = None
    if low >= high:
        steps, basis = high, "step markers that ran a graph"
        if host_reads == 0 and markers >= graphs:
            explanation = [
                f"{_count(steps, 'step')}: the step markers that ran a graph, one per graph: with no "
                f"host read, no graph ran before a step's end."
            ]
        else:
            explanation = [
                f"{_count(steps, 'step')}: the step markers that ran a graph, which the report pins down. {bounds}"
            ]
        if low > high:
            explanation.append(
                f"{_count(low - high, 'graph')} ran neither at a step marker nor for a host read; "
                f"the report does not say what ran them."
            )
    elif low == 0:
        steps, basis = high, "one per graph, at most one per step marker"
        explanation = [
            f"{_count(steps, 'step')}: one per graph, at most one per step marker. The "
            f"{_count(host_reads, 'host read')} cannot all have cut a graph before their step's end "
            f"(no graph would then be left for the step markers), so they are taken as reads after "
            f"their step had ended, such as a loss.item() after torch_xla.sync(), which run no graph."
        ]
    elif host_reads >= low:
        steps, basis, alternative = low, "graphs that no host read explains", high
        explanation = [
            f"{_count(steps, 'step')}: the graphs that no host read explains ({graphs} graphs - "
            f"{host_reads} host reads). {bounds} Counted here as if every read came before its step's "
            f"end and cut a graph, as the reads are at least one per step. If some came after their "
            f"step had ended (a loss.item() after torch_xla.sync() runs no graph), there were more "
            f"steps, up to {high}."
        ]
    else:
        steps, basis, alternative = high, "one per graph, at most one per step marker", low
        explanation = [
            f"{_count(steps, 'step')}: one per graph, at most one per step marker, as if the "
            f"{_count(host_reads, 'host read')} came after their step had ended (a loss.item() after "
            f"torch_xla.sync() runs no graph). {bounds} If every read came before its step's end "
            f"instead, each cutting a graph, there were {low} steps."
        ]
    if markers > steps:
        explanation.append(
            f"The {_count(markers, 'step marker')} (MarkStep) count every sync, also those that ran "
            f"no graph: {EMPTY_SYNCS}."
        )
    return StepCount(steps, basis, explanation + unused + [NOT_TRAINING_STEPS], alternative)


@dataclass
class _Figures:
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


def _figures(snapshot: Snapshot, history: SyncHistory | None, training_steps: int | None = None) -> _Figures:
    executions = sum(snapshot.metric(name).total_samples for name in EXECUTE_METRICS)
    executions = executions or snapshot.counter("ExecuteComputation")
    fallback = [(name, value) for name, value in snapshot.counters.items() if is_cpu_fallback_op(name) and value > 0]
    short = bool(snapshot.counters) and all(
        name in SHORT_REPORT_COUNTERS or name.startswith("aten::") for name in snapshot.counters
    )
    graphs = _graphs(snapshot) or executions  # executions finish asynchronously: the lookups are the surer count
    host_reads = sum(snapshot.metric(name).total_samples for name in HOST_READ_METRICS)
    markers = snapshot.counter("MarkStep")
    return _Figures(
        markers=markers,
        compiles=_compiles(snapshot),
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


def _overview(f: _Figures) -> list[str]:
    busy = f.compile_seconds + f.execute_seconds
    share = f" ({100 * f.compile_seconds / busy:.0f}% of compile + execute time)" if busy > 0 else ""
    calls = sum(count for _, count in f.fallback)
    counted = f"{f.count.steps} ({f.count.basis}; see Steps)" if f.count.steps else f"unknown ({f.count.basis})"
    if f.training_steps:
        training = f"{f.training_steps}, as given with --steps"
    else:
        training = "unknown: a report does not count optimizer steps (give them with --steps N)"
    return [
        f"  training steps:          {training}",
        f"  markers that ran graphs: {counted}",
        f"  step markers (MarkStep): {f.markers}, every sync, also those that ran no graph",
        f"  graphs run:              {f.graphs} ({f.compiles} compiled, {f.cache_hits} from the compile cache); "
        f"{f.per_step(f.graphs)}",
        f"  graph executions:        {f.executions}, {f.execute_seconds:.3f} s executing",
        f"  compilations:            {f.compiles}, {f.compile_seconds:.3f} s compiling{share}",
        f"  host reads:              {f.host_reads} device-to-host transfers ({f.per_step(f.host_reads)}), "
        f"{f.scalar_reads} of them .item()",
        f"  CPU fallback operators:  {_count(len(f.fallback), 'operator')}, {_count(calls, 'call')}",
    ]


def _fallback(f: _Figures, listed: set[str]) -> Finding | None:
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
        f"CPU fallback: {_count(len(f.fallback), 'operator')} without an XLA lowering ran on the CPU",
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


def _host_reads(f: _Figures, listed: set[str]) -> Finding | None:
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


def _fragmentation(f: _Figures, listed: set[str]) -> Finding | None:
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
        f"{_count(f.steps, f.unit)})",
        details,
        [
            "Remove the graph cuts so that the whole step is traced into one graph: read values after the step's "
            "end, and replace CPU fallback operators.",
            "To see the Python line that made each graph, run once with PT_XLA_DEBUG_LEVEL=1: every compilation "
            "then prints its cause and the frame that triggered it.",
        ],
    )


def _late_compiles(f: _Figures, listed: set[str]) -> Finding | None:
    if not f.steps:
        return None
    graphs_per_step = math.ceil(f.graphs / f.steps)  # the graphs a step runs, each compiled when first run
    late = f.compiles - graphs_per_step
    if late < max(MIN_LATE_COMPILES, LATE_COMPILES_PER_STEP * f.steps):
        return None
    busy = f.compile_seconds + f.execute_seconds
    share = f"{100 * f.compile_seconds / busy:.0f}%" if busy > 0 else "most"
    return Finding(
        f"Compilations after the first steps: {late} ({f.compiles} compilations in {_count(f.steps, f.unit)})",
        [
            f"At {f.graphs / f.steps:.1f} graphs per {f.unit}, the first steps need about "
            f"{_count(graphs_per_step, 'compilation')}; the other {late} came later. Compiling took "
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


def _findings(f: _Figures) -> list[Finding]:
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
    return _findings(_figures(snapshot, history, training_steps))


def explain(snapshot: Snapshot, history: SyncHistory | None = None, training_steps: int | None = None) -> str:
    """The diagnosis as text: an overview of the figures, how the steps were counted, then each finding.

    ``history``: the reports of an XLA_METRICS_FILE dump up to ``snapshot``, its last one. ``training_steps``: the
    training steps the report covers, as the user counted them; without them the figures are per step marker.
    """
    f = _figures(snapshot, history, training_steps)
    lines = ["Overview", *_overview(f)]
    if f.short_report:
        lines += [
            "",
            _wrap(
                "This is a short_metrics_report(): it lists only the aten:: operators that ran on the "
                "CPU, not those of other namespaces (torchvision::, custom ops), and few other counters. "
                "Save met.metrics_report() to see them all.",
                "",
            ),
        ]
    given = (
        [f"The per-step figures are per training step: {f.training_steps}, as given with --steps."]
        if f.training_steps
        else []
    )
    lines += ["", "Steps", *[_wrap(text, "   ") for text in given + f.count.explanation], ""]
    found = _findings(f)
    if not found:
        if f.steps:
            lines.append(
                _wrap(
                    "Nothing wrong found: no CPU fallback operator, no more than "
                    f"{HOST_READS_PER_STEP} host reads per {f.unit}, one graph per {f.unit}, and no "
                    "compilations after the first steps.",
                    "",
                )
            )
        else:
            lines.append(
                _wrap(
                    "Nothing wrong found: no CPU fallback operator and no .item() call. Without a step "
                    "count, the per-step checks (graphs, host reads, compilations) could not run.",
                    "",
                )
            )
        return "\n".join(lines) + "\n"
    lines.append(f"Findings ({len(found)})")
    for number, finding in enumerate(found, 1):
        lines += ["", f"{number}. {finding.title}"]
        lines += [_wrap(detail, "   ") for detail in finding.details]
        lines.append("   What to do next:")
        lines += [_wrap(step, "   - ", "     ") for step in finding.next_steps]
    return "\n".join(lines) + "\n"


def _join(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" + ("" if number == 1 else "s")


def _wrap(text: str, first: str, rest: str | None = None) -> str:
    if text.startswith("  "):  # a table row: keep it as it is
        return first + text
    return textwrap.fill(
        text,
        WIDTH,
        initial_indent=first,
        subsequent_indent=rest or first,
        break_long_words=False,
        break_on_hyphens=False,
    )
