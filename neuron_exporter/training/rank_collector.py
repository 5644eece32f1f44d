"""The Prometheus collector of one training process (one rank): the parts each source adds (``training_steps``,
``torch_compile``, torch_xla's ``steps``, ``sites`` and ``xla``, ``torchneuron``), the process
(``training_process_*``), and the exporter's own families, each built from its entry of the catalogue.

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
from prometheus_client.core import Metric

from .. import catalogue
from ..metric_family import labelled_family, single_series
from .rank import rank_labels, workload_labels
from .self_metrics import STAGES, SelfStats, build_labels


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
        parts: list[tuple[tuple[str], float]] = []
        durations: list[tuple[tuple[str], float]] = []
        for part, collect_part in {**self._parts, "process": self._process_families}.items():
            start = time.perf_counter()
            try:
                families = list(collect_part(labels))
                ok = 1
            except Exception as error:  # noqa: BLE001 (a broken part must not take /metrics down)
                self.stats.record_error("scrape", error)
                families, ok = [], 0
            yield from families
            parts.append(((part,), ok))
            durations.append(((part,), time.perf_counter() - start))
        yield labelled_family(catalogue.COLLECTOR_SUCCESS, labels, parts)
        yield labelled_family(catalogue.COLLECTOR_DURATION, labels, durations)
        yield from self._self_families(labels)

    def _process_families(self, labels: dict[str, str]) -> Iterator[Metric]:
        process = psutil.Process(os.getpid())
        with process.oneshot():
            memory = process.memory_info().rss
            cpu = process.cpu_times()
            threads = process.num_threads()
        # The xla_process_* names, which the training_process_* ones replace, are served for one more release
        # where torch_xla is imported, so that rules and dashboards written for them go on working there.
        names = (PROCESS_NAMES, OLD_PROCESS_NAMES) if "torch_xla" in sys.modules else (PROCESS_NAMES,)
        for memory_family, cpu_family, threads_family in names:
            yield single_series(memory_family, labels, memory)
            yield single_series(cpu_family, labels, cpu.user + cpu.system)
            yield single_series(threads_family, labels, threads)

    def _self_families(self, labels: dict[str, str]) -> Iterator[Metric]:
        yield single_series(catalogue.RANK_INFO, {**labels, **workload_labels()}, 1)
        yield single_series(catalogue.BUILD_INFO, {**labels, **build_labels()}, 1)
        errors = [((stage,), self.stats.errors[stage]) for stage in STAGES]
        yield labelled_family(catalogue.COLLECTION_ERRORS, labels, errors)
        started = [((source,), int(ok)) for source, ok in sorted(self.stats.sources.items())]
        yield labelled_family(catalogue.SOURCE_STARTED, labels, started)
        yield single_series(catalogue.STEP_HOOK_SECONDS, labels, self.stats.hook_seconds)


PROCESS_NAMES = (catalogue.PROCESS_MEMORY, catalogue.PROCESS_CPU, catalogue.PROCESS_THREADS)
OLD_PROCESS_NAMES = (catalogue.OLD_PROCESS_MEMORY, catalogue.OLD_PROCESS_CPU, catalogue.OLD_PROCESS_THREADS)
