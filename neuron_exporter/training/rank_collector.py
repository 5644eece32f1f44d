"""The Prometheus collector of one training process (one rank).

Each part (steps, torch_xla, process) is collected on its own: a part that fails is left out of that scrape,
counted in ``neuron_exporter_collection_errors_total{stage="scrape"}`` and shown by
``neuron_exporter_collector_success{collector=...} 0``; the rest of /metrics is still served.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator

import psutil
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from ..metric_family import single_series
from ..snapshot_metrics import LabelBudget, snapshot_families
from .attribution import Attribution, SiteRecord
from .rank import rank_labels, workload_labels
from .self_metrics import STAGES, SelfStats, build_labels
from .step_tracker import Histogram, StepTracker
from .xla_reader import MonotonicSnapshots, XlaReader


class RankCollector:
    def __init__(self, reader: XlaReader, tracker: StepTracker, stats: SelfStats, max_op_series: int,
                 attribution: Attribution | None = None, max_site_series: int = 50):
        self.reader = reader
        self.tracker = tracker
        self.stats = stats
        self.attribution = attribution or Attribution()
        self._site_budgets = {family: LabelBudget(max_site_series) for family in (*SITE_FAMILIES, FALLBACK_SITES)}
        self._totals = MonotonicSnapshots()
        self._fallback_budget = LabelBudget(max_op_series)
        self._lowered_budget = LabelBudget(max_op_series)
        self._parts: dict[str, Callable[[dict[str, str]], Iterator[Metric]]] = {
            "steps": self._step_families,
            "sites": self._site_families,
            "xla": self._xla_families,
            "process": self._process_families,
        }

    def add_part(self, name: str, collect_part: Callable[[dict[str, str]], Iterator[Metric]]) -> None:
        """Another part of the scrape (e.g. ``torch_compile``), collected and reported on like the others."""
        self._parts[name] = collect_part

    def describe(self) -> Iterator[Metric]:
        return iter(())  # the families depend on what torch_xla has recorded; no up-front description

    def collect(self) -> Iterator[Metric]:
        labels = rank_labels()
        names = list(labels)
        success = GaugeMetricFamily("neuron_exporter_collector_success",
                                    "1 if the collector's last scrape succeeded, 0 if it failed",
                                    labels=names + ["collector"])
        duration = GaugeMetricFamily("neuron_exporter_collector_duration_seconds",
                                     "Time the collector's last scrape took", labels=names + ["collector"])
        for part, collect_part in self._parts.items():
            start = time.perf_counter()
            try:
                families = list(collect_part(labels))
                ok = 1
            except Exception as error:  # noqa: BLE001 (a broken part must not take /metrics down)
                self.stats.record_error("scrape", error)
                families, ok = [], 0
            yield from families
            success.add_metric(list(labels.values()) + [part], ok)
            duration.add_metric(list(labels.values()) + [part], time.perf_counter() - start)
        yield success
        yield duration
        yield from self._self_families(labels)

    def _step_families(self, labels: dict[str, str]) -> Iterator[Metric]:
        state = self.tracker.state()

        def counter(name: str, documentation: str, value: float) -> Metric:
            return single_series(CounterMetricFamily, name, documentation, labels, value)

        yield counter("xla_steps", "Training steps: optimizer steps once the process steps a torch.optim optimizer, "
                                   "else step markers that ran a graph", state.steps)
        yield _histogram("xla_step_duration_seconds", "Wall time from one step end to the next",
                         labels, state.step_duration)
        yield _histogram("xla_graphs_per_step", "Graphs run in a step, at step markers and cut off before them",
                         labels, state.graphs_per_step)
        yield counter("xla_fragmented_steps", "Steps in which a graph was cut", state.fragmented_steps)
        yield counter("xla_step_markers", "Step markers that ran a graph (mark_step, sync, loaders)", state.markers)
        yield counter("neuron_exporter_syncs", "Step markers seen, including empty syncs that are not steps",
                      state.syncs)

    def _site_families(self, labels: dict[str, str]) -> Iterator[Metric]:
        records = self.attribution.records()
        for name, (documentation, extra) in SITE_FAMILIES.items():
            family = CounterMetricFamily(name, documentation, labels=list(labels) + extra)
            budget = self._site_budgets[name]
            values: dict[tuple[str, ...], float] = {}
            for record in records:
                location = budget.label_for(record.location)
                for key, value in _site_values(name, record):
                    values[(*key, location)] = values.get((*key, location), 0) + value
            for key, value in sorted(values.items()):
                family.add_metric(list(labels.values()) + list(key), value)
            yield family
        family = GaugeMetricFamily(FALLBACK_SITES, "Where a CPU-fallback operator was called, as the fallback_sites "
                                                   "option's probe saw it (pass: forward, or backward for a call from "
                                                   "the backward pass, named by the line that called backward()); "
                                                   "always 1", labels=list(labels) + ["op", "location", "pass"])
        budget = self._site_budgets[FALLBACK_SITES]
        shown = {(self._fallback_budget.label_for(site.op), budget.label_for(site.location), site.pass_name)
                 for site in self.attribution.fallback_sites()}
        for key in sorted(shown):
            family.add_metric(list(labels.values()) + list(key), 1)
        yield family

    def _xla_families(self, labels: dict[str, str]) -> Iterator[Metric]:
        snapshot = self._totals.read(self.reader.snapshot)
        yield from snapshot_families(snapshot, labels, self._fallback_budget, self._lowered_budget)

    def _process_families(self, labels: dict[str, str]) -> Iterator[Metric]:
        process = psutil.Process(os.getpid())
        with process.oneshot():
            memory = process.memory_info().rss
            cpu = process.cpu_times()
            threads = process.num_threads()
        yield single_series(GaugeMetricFamily, "xla_process_resident_memory_bytes",
                            "Resident memory of the training process", labels, memory)
        yield single_series(CounterMetricFamily, "xla_process_cpu_seconds",
                            "CPU time of the training process (user + system)", labels, cpu.user + cpu.system)
        yield single_series(GaugeMetricFamily, "xla_process_threads", "Threads of the training process", labels,
                            threads)

    def _self_families(self, labels: dict[str, str]) -> Iterator[Metric]:
        yield single_series(GaugeMetricFamily, "neuron_exporter_rank_info",
                            "Where the rank runs: Kubernetes pod, namespace, node and container (from the downward "
                            "API variables POD_NAME, POD_NAMESPACE, NODE_NAME, CONTAINER_NAME); always 1",
                            {**labels, **workload_labels()}, 1)
        yield single_series(GaugeMetricFamily, "neuron_exporter_build_info",
                            "Versions of the exporter and of what it runs with", {**labels, **build_labels()}, 1)
        family = CounterMetricFamily("neuron_exporter_collection_errors",
                                     "Failures inside the exporter, by stage (step hook, scrape, spool write)",
                                     labels=list(labels) + ["stage"])
        for stage in STAGES:
            family.add_metric(list(labels.values()) + [stage], self.stats.errors[stage])
        yield family
        yield single_series(CounterMetricFamily, "neuron_exporter_step_hook_seconds",
                            "Time the exporter spent in its step hook, on the training thread", labels,
                            self.stats.hook_seconds)
        yield single_series(GaugeMetricFamily, "neuron_exporter_warmup_steps",
                            "Steps treated as warm-up: their compiles are not recompilations", labels,
                            self.tracker.warmup_steps)


FALLBACK_SITES = "xla_cpu_fallback_site_info"
SITE_FAMILIES = {
    "xla_graph_cuts": ("Graphs run before a step marker, by cause (the host read: item, bool, print, ...; "
                       "cpu_fallback; unattributed) and source line", ["cause", "location"]),
    "xla_host_reads": ("Reads of device data by the host, by cause and source line, whether or not they ran a graph",
                       ["cause", "location"]),
    "xla_new_graphs": ("First compilations of a graph (a new code path: an eval loop, a logging step), by the "
                       "source line that ran it", ["location"]),
    "xla_recompilations": ("Compilations of a graph that compiled before, after warm-up (shapes or Python values "
                           "changed), by the source line that ran it", ["location"]),
}


def _site_values(family: str, record: SiteRecord):
    """((label values but location), value) of one site's record for one family."""
    if family == "xla_graph_cuts":
        return [((cause,), count) for cause, count in record.cuts.items()]
    if family == "xla_host_reads":
        return [((cause,), count) for cause, count in record.causes.items()]
    count = record.new_graphs if family == "xla_new_graphs" else record.recompilations
    return [((), count)] if count else []


def _histogram(name: str, documentation: str, labels: dict[str, str], histogram: Histogram) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, documentation, labels=list(labels))
    family.add_metric(list(labels.values()), histogram.cumulative(), histogram.total)
    return family
