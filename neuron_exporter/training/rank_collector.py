"""The Prometheus collector of one training process (one rank): the parts each source adds (``training_steps``,
``torch_compile``, torch_xla's ``steps``, ``sites`` and ``xla``), the process (``training_process_*``), and the
exporter's own families.

Each part is collected on its own: a part that fails is left out of that scrape,
counted in ``neuron_exporter_collection_errors_total{stage="scrape"}`` and shown by
``neuron_exporter_collector_success{collector=...} 0``; the rest of /metrics is still served.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator

import psutil
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ..metric_family import single_series
from .dynamo_callbacks import restore as restore_callbacks
from .rank import rank_labels, workload_labels
from .self_metrics import STAGES, START_TRIES, SelfStats, build_labels


class RankCollector:
    def __init__(self, stats: SelfStats):
        self.stats = stats
        self._parts: dict[str, Callable[[dict[str, str]], Iterator[Metric]]] = {}

    def add_part(self, name: str, collect_part: Callable[[dict[str, str]], Iterator[Metric]]) -> None:
        """A part of the scrape (e.g. ``torch_compile``), collected and reported on like the others."""
        self._parts = {**self._parts, name: collect_part}  # a new dict: a scrape may be iterating the old one

    def describe(self) -> Iterator[Metric]:
        return iter(())  # the families depend on what the sources have recorded; no up-front description

    def collect(self) -> Iterator[Metric]:
        labels = rank_labels()
        names = list(labels)
        success = GaugeMetricFamily(
            "neuron_exporter_collector_success",
            "1 if the collector's last scrape succeeded, 0 if it failed",
            labels=names + ["collector"],
        )
        duration = GaugeMetricFamily(
            "neuron_exporter_collector_duration_seconds",
            "Time the collector's last scrape took",
            labels=names + ["collector"],
        )
        restore_callbacks()  # every source's compile callbacks that torch._dynamo.reset() dropped
        for part, collect_part in {**self._parts, "process": self._process_families}.items():
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

    def _process_families(self, labels: dict[str, str]) -> Iterator[Metric]:
        process = psutil.Process(os.getpid())
        with process.oneshot():
            memory = process.memory_info().rss
            cpu = process.cpu_times()
            threads = process.num_threads()
        # The xla_process_* names, which the training_process_* ones replace, are served for one more release
        # where torch_xla is imported, so that rules and dashboards written for them go on working there.
        for prefix in ("training", "xla") if "torch_xla" in sys.modules else ("training",):
            yield single_series(
                GaugeMetricFamily,
                f"{prefix}_process_resident_memory_bytes",
                "Resident memory of the training process",
                labels,
                memory,
            )
            yield single_series(
                CounterMetricFamily,
                f"{prefix}_process_cpu_seconds",
                "CPU time of the training process (user + system)",
                labels,
                cpu.user + cpu.system,
            )
            yield single_series(
                GaugeMetricFamily, f"{prefix}_process_threads", "Threads of the training process", labels, threads
            )

    def _self_families(self, labels: dict[str, str]) -> Iterator[Metric]:
        yield single_series(
            GaugeMetricFamily,
            "neuron_exporter_rank_info",
            "Where the rank runs: Kubernetes pod, namespace, node and container (from the downward "
            "API variables POD_NAME, POD_NAMESPACE, NODE_NAME, CONTAINER_NAME); always 1",
            {**labels, **workload_labels()},
            1,
        )
        yield single_series(
            GaugeMetricFamily,
            "neuron_exporter_build_info",
            "Versions of the exporter and of what it runs with",
            {**labels, **build_labels()},
            1,
        )
        family = CounterMetricFamily(
            "neuron_exporter_collection_errors",
            "Failures inside the exporter, by stage (step hook, scrape, spool write)",
            labels=list(labels) + ["stage"],
        )
        for stage in STAGES:
            family.add_metric(list(labels.values()) + [stage], self.stats.errors[stage])
        yield family
        started = GaugeMetricFamily(
            "neuron_exporter_source_started",
            "1 once a source's hooks are in, 0 while its library is imported but it could not start (it tries again "
            f"when an optimizer is created or steps, up to {START_TRIES} times)",
            labels=list(labels) + ["source"],
        )
        for source, ok in sorted(self.stats.sources.items()):
            started.add_metric(list(labels.values()) + [source], int(ok))
        yield started
        yield single_series(
            CounterMetricFamily,
            "neuron_exporter_step_hook_seconds",
            "Time the exporter spent in its step hook, on the training thread",
            labels,
            self.stats.hook_seconds,
        )
