"""The torch_xla families of one training process: steps, sites (where and why), and torch_xla's own counters and
metrics. Read from the ``XlaSource`` at each scrape (a forked child replaces its tracker and attribution)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ...metric_family import histogram_family, single_series
from ...snapshot_metrics import snapshot_families
from ...untrusted import LabelBudget
from ..attribution import SiteRecord
from .reader import MonotonicSnapshots


class XlaFamilies:
    def __init__(self, source, max_op_series: int, max_site_series: int):
        """``source``: the ``XlaSource`` (its ``reader``, ``tracker`` and ``attribution``)."""
        self.source = source
        self._site_budgets = {family: LabelBudget(max_site_series) for family in (*SITE_FAMILIES, FALLBACK_SITES)}
        self._totals = MonotonicSnapshots()
        self._fallback_budget = LabelBudget(max_op_series)
        self._lowered_budget = LabelBudget(max_op_series)

    def parts(self) -> dict[str, Callable[[dict[str, str]], Iterator[Metric]]]:
        return {"steps": self._step_families, "sites": self._site_families, "xla": self._xla_families}

    def _step_families(self, labels: dict[str, str]) -> Iterator[Metric]:
        state = self.source.tracker.state()

        def counter(name: str, documentation: str, value: float) -> Metric:
            return single_series(CounterMetricFamily, name, documentation, labels, value)

        yield counter(
            "xla_steps",
            "Training steps: optimizer steps once the process steps a torch.optim optimizer, "
            "else step markers that ran a graph",
            state.steps,
        )
        yield histogram_family(
            "xla_step_duration_seconds",
            "Wall time from one step end to the next (a training step's first from the optimizer's creation)",
            labels,
            state.step_duration,
        )
        yield histogram_family(
            "xla_graphs_per_step",
            "Graphs run in a step, at step markers and cut off before them",
            labels,
            state.graphs_per_step,
        )
        yield counter("xla_fragmented_steps", "Steps in which a graph was cut", state.fragmented_steps)
        yield counter("xla_step_markers", "Step markers that ran a graph (mark_step, sync, loaders)", state.markers)
        yield counter(
            "neuron_exporter_syncs", "Step markers seen, including empty syncs that are not steps", state.syncs
        )
        yield single_series(
            GaugeMetricFamily,
            "neuron_exporter_warmup_steps",
            "Steps a rank makes before its recompilations alert (XlaRecompilationStorm)",
            labels,
            self.source.tracker.warmup_steps,
        )

    def _site_families(self, labels: dict[str, str]) -> Iterator[Metric]:
        records = self.source.attribution.records()
        for name, (documentation, extra) in SITE_FAMILIES.items():
            family = CounterMetricFamily(name, documentation, labels=list(labels) + extra)
            budget = self._site_budgets[name]
            values: dict[tuple[str, ...], float] = {}
            for record in records:
                location = budget.label_for(record.location)
                for key, value in _site_values(name, record):
                    index = (*key, location)
                    values[index] = values.get(index, 0) + value
            for key, value in sorted(values.items()):
                family.add_metric(list(labels.values()) + list(key), value)
            yield family
        sites_family = GaugeMetricFamily(
            FALLBACK_SITES,
            "Where a CPU-fallback operator was called, as the fallback_sites "
            "option's probe saw it (pass: forward, or backward for a call from "
            "the backward pass, named by the line that called backward()); "
            "always 1",
            labels=list(labels) + ["op", "location", "pass"],
        )
        budget = self._site_budgets[FALLBACK_SITES]
        shown = {
            (self._fallback_budget.label_for(site.op), budget.label_for(site.location), site.pass_name)
            for site in self.source.attribution.fallback_sites()
        }
        for key in sorted(shown):
            sites_family.add_metric(list(labels.values()) + list(key), 1)
        yield sites_family

    def _xla_families(self, labels: dict[str, str]) -> Iterator[Metric]:
        snapshot = self._totals.read(self.source.reader.snapshot)
        yield from snapshot_families(snapshot, labels, self._fallback_budget, self._lowered_budget)


FALLBACK_SITES = "xla_cpu_fallback_site_info"
SITE_FAMILIES = {
    "xla_graph_cuts": (
        "Graphs run before a step marker, by cause (the host read: item, bool, print, ...; "
        "cpu_fallback; unattributed) and source line",
        ["cause", "location"],
    ),
    "xla_host_reads": (
        "Reads of device data by the host, by cause and source line, whether or not they ran a graph",
        ["cause", "location"],
    ),
    "xla_new_graphs": (
        "First compilations of a computation (a new code path: the first step, an eval loop, a "
        "logging step), by the source line that ran it",
        ["location"],
    ),
    "xla_recompilations": (
        "Compilations of a computation that compiled before, for other input shapes or Python "
        "values, by the source line that ran it",
        ["location"],
    ),
}


def _site_values(family: str, record: SiteRecord):
    """((label values but location), value) of one site's record for one family."""
    if family == "xla_graph_cuts":
        return [((cause,), count) for cause, count in record.cuts.items()]
    if family == "xla_host_reads":
        return [((cause,), count) for cause, count in record.causes.items()]
    count = record.new_graphs if family == "xla_new_graphs" else record.recompilations
    return [((), count)] if count else []
