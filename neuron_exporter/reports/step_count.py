"""How many steps a torch_xla metrics report covers, and how that was worked out.

Per-step figures need a count of training steps, and a report has none: it counts step markers (``MarkStep``,
every sync, also those that ran no graph), graphs (compile cache lookups) and host reads (device-to-host
transfers), and knows nothing of optimizer steps. ``step_count`` works out the step markers that ran a graph from
those, and says how; a dump with a report per sync (``SyncHistory``) counts them directly.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..snapshot import Snapshot

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
        markers, graphs = snapshot.counter("MarkStep"), graphs_run(snapshot)
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


def graphs_run(snapshot: Snapshot) -> int:
    return snapshot.counter("CachedCompile") + compilations(snapshot)


def compilations(snapshot: Snapshot) -> int:
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
            0, "no graphs", [f"No graph ran in the {plural(markers, 'step marker')}, so there is no per-step figure."]
        )
    if history is not None and history.usable:
        steps = history.syncs_with_graph
        explanation = [
            f"{plural(steps, 'step')}: the syncs after which more graphs had run than before, counted "
            f"over the {history.reports} reports of the XLA_METRICS_FILE dump, one per sync. A sync "
            f"that follows a graph cut counts even if it ran no graph itself."
        ]
        if markers > steps:
            explanation.append(
                f"The other {markers - steps} of the {plural(markers, 'step marker')} (MarkStep) "
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
        f"(a host read). Of the {plural(graphs, 'graph')}, at most {host_reads} ran for host reads, so at "
        f"least {low} ran at step markers; and at most {high} can have, one per marker."
    )
    alternative = None
    if low >= high:
        steps, basis = high, "step markers that ran a graph"
        if host_reads == 0 and markers >= graphs:
            explanation = [
                f"{plural(steps, 'step')}: the step markers that ran a graph, one per graph: with no "
                f"host read, no graph ran before a step's end."
            ]
        else:
            explanation = [
                f"{plural(steps, 'step')}: the step markers that ran a graph, which the report pins down. {bounds}"
            ]
        if low > high:
            explanation.append(
                f"{plural(low - high, 'graph')} ran neither at a step marker nor for a host read; "
                f"the report does not say what ran them."
            )
    elif low == 0:
        steps, basis = high, "one per graph, at most one per step marker"
        explanation = [
            f"{plural(steps, 'step')}: one per graph, at most one per step marker. The "
            f"{plural(host_reads, 'host read')} cannot all have cut a graph before their step's end "
            f"(no graph would then be left for the step markers), so they are taken as reads after "
            f"their step had ended, such as a loss.item() after torch_xla.sync(), which run no graph."
        ]
    elif host_reads >= low:
        steps, basis, alternative = low, "graphs that no host read explains", high
        explanation = [
            f"{plural(steps, 'step')}: the graphs that no host read explains ({graphs} graphs - "
            f"{host_reads} host reads). {bounds} Counted here as if every read came before its step's "
            f"end and cut a graph, as the reads are at least one per step. If some came after their "
            f"step had ended (a loss.item() after torch_xla.sync() runs no graph), there were more "
            f"steps, up to {high}."
        ]
    else:
        steps, basis, alternative = high, "one per graph, at most one per step marker", low
        explanation = [
            f"{plural(steps, 'step')}: one per graph, at most one per step marker, as if the "
            f"{plural(host_reads, 'host read')} came after their step had ended (a loss.item() after "
            f"torch_xla.sync() runs no graph). {bounds} If every read came before its step's end "
            f"instead, each cutting a graph, there were {low} steps."
        ]
    if markers > steps:
        explanation.append(
            f"The {plural(markers, 'step marker')} (MarkStep) count every sync, also those that ran "
            f"no graph: {EMPTY_SYNCS}."
        )
    return StepCount(steps, basis, explanation + unused + [NOT_TRAINING_STEPS], alternative)


def plural(number: int, noun: str) -> str:
    return f"{number} {noun}" + ("" if number == 1 else "s")
