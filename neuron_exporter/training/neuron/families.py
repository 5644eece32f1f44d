"""The TorchNeuron families of one training process (``torchneuron_*``), read from the ``NeuronSource`` at scrape
time: nothing here synchronizes the device (see ``names``).

Not ``xla_*`` (there is no XLA in a TorchNeuron process) nor ``neuron_*``/``neuroncore_*`` (AWS's neuron-monitor
exports those). Host reads have the causes and the ``location`` rules of ``xla_host_reads_total``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ...metric_family import readable_family, single_series
from ...untrusted import LabelBudget
from .names import COUNTERS_KEY, RECORDS, memory_value

READABLE_FAMILY = "neuron_exporter_torchneuron_readable"
# Seconds of eager compilations are a difference of two float totals: it can come out lower by a rounding error.
ROUNDING = 1e-9


class Totals:
    """Counters read from TorchNeuron's own totals, kept from going backwards when they are reset (a reset is a value
    lower than the last one, by more than a rounding error: what was counted before it is kept as an offset). The
    values are read under the lock they are applied under: a read of two overlapping scrapes applied after a newer
    one would look like a reset."""

    def __init__(self):
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}
        self._offset: dict[str, float] = {}

    def read(self, reader: Callable[[], dict[str, float]]) -> dict[str, float]:
        """The totals of what ``reader()`` reads now (its exceptions are the caller's)."""
        with self._lock:
            values = reader()
            totals = {}
            for key, value in values.items():
                last = self._last.get(key, 0)
                if value < last:
                    if last - value <= ROUNDING * max(1.0, last):  # a derived total's rounding, not a reset
                        value = last
                    else:
                        self._offset[key] = self._offset.get(key, 0) + last
                self._last[key] = value
                totals[key] = self._offset.get(key, 0) + value
            return totals


class NeuronFamilies:
    def __init__(self, source, max_op_series: int, max_site_series: int):
        """``source``: the ``NeuronSource`` (its ``readable`` records and what it counted)."""
        self.source = source
        self._ops = {name: LabelBudget(max_op_series) for name in ("calls", "seen", "sites")}
        self._sites = {name: LabelBudget(max_site_series) for name in ("host_reads", "sites")}
        self._reasons = LabelBudget(max_site_series)
        self._totals = Totals()

    def clear(self) -> None:
        """A forked child's fresh state: none of the parent's totals, budgets or (maybe held) locks."""
        self._ops = {name: LabelBudget(budget.limit) for name, budget in self._ops.items()}
        self._sites = {name: LabelBudget(budget.limit) for name, budget in self._sites.items()}
        self._reasons = LabelBudget(self._reasons.limit)
        self._totals = Totals()

    def parts(self):
        return {"torchneuron": self.collect}

    def collect(self, labels: dict[str, str]) -> Iterator[Metric]:
        """Each record read on its own: one that fails now (TorchNeuron changed under the exporter) is counted as a
        scrape error, shown unreadable in this scrape, and the others are served."""
        source = self.source
        readable = list(source.readable)
        families: list[Metric] = []
        parts: list[tuple[str | None, Callable[[dict[str, str]], Iterator[Metric]]]] = [
            ("fallback_op_calls", self._fallback_calls),
            ("fallback_ops_seen", self._fallbacks_seen),
            ("compile_cache", self._cache),
            ("compiled_graphs", self._graphs),
            ("graph_fallbacks", self._graph_fallbacks),
            (None, self._host_reads),  # the exporter's own count, always read
            ("memory", self._memory),
        ]
        for record, part in parts:
            if record is not None and record not in readable:
                continue
            try:
                families.extend(part(labels))
            except Exception as error:  # noqa: BLE001 (the other records are still served)
                source.stats.record_error("scrape", error)
                if record is not None:
                    readable.remove(record)
        yield readable_family(
            READABLE_FAMILY,
            "1 if the exporter reads this record of TorchNeuron in this process, 0 if a name it comes from is "
            "missing or of another shape (the log says which), by record",
            labels,
            RECORDS,
            readable,
        )
        yield from families

    def _graph_fallbacks(self, labels: dict[str, str]) -> Iterator[Metric]:
        counts, _ = self.source.graph_fallbacks.snapshot()
        yield self._labelled(
            "torchneuron_graph_fallbacks",
            "Compiled graphs (torch.compile, neuron backend) that failed to run and ran eagerly instead, by the "
            "reason TorchNeuron logged",
            labels,
            ["reason"],
            [((self._reasons.label_for(reason),), count) for reason, count in counts.items()],
        )

    def _host_reads(self, labels: dict[str, str]) -> Iterator[Metric]:
        yield self._labelled(
            "torchneuron_host_reads",
            "Reads of neuron device data by the host (.item(), bool, print, .cpu(), ...; each waits for the device), "
            "by cause and source line",
            labels,
            ["cause", "location"],
            [
                ((cause, self._sites["host_reads"].label_for(record.location)), count)
                for record in self.source.attribution.records()
                for cause, count in record.causes.items()
            ],
        )

    def _fallback_calls(self, labels: dict[str, str]) -> Iterator[Metric]:
        source = self.source
        calls, sites = source.fallbacks.snapshot()
        yield self._labelled(
            "torchneuron_cpu_fallback_op_calls",
            "Calls of operators TorchNeuron registers from Python that ran on the CPU (each counted as it "
            "happens), by operator",
            labels,
            ["op"],
            [((self._ops["calls"].label_for(op),), count) for op, count in calls.items()],
        )
        yield self._labelled(
            "torchneuron_cpu_fallback_site_info",
            "Where a CPU-fallback operator counted per call was called (pass: forward, or backward for a call "
            "from the backward pass, named by the line that called backward()); always 1",
            labels,
            ["op", "location", "pass"],
            [
                (
                    (
                        self._ops["sites"].label_for(op),
                        self._sites["sites"].label_for(location),
                        "backward" if backward else "forward",
                    ),
                    1,
                )
                for op, location, _, backward in sites
            ],
            GaugeMetricFamily,
        )

    def _fallbacks_seen(self, labels: dict[str, str]) -> Iterator[Metric]:
        source = self.source
        yield self._labelled(
            "torchneuron_cpu_fallback_ops_seen",
            "Operators TorchNeuron ran on the CPU at least once (no Neuron kernel, a Python implementation that "
            "could not take the call, or a failure in the device pipeline), from its set of their names; always 1",
            labels,
            ["op"],
            [((self._ops["seen"].label_for(op),), 1) for op in source.fallback_ops_seen()],
            GaugeMetricFamily,
        )

    def _cache(self, labels: dict[str, str]) -> Iterator[Metric]:
        totals = self._totals.read(self._cache_values)
        yield self._labelled(
            "torchneuron_compile_cache_hits",
            "NEFFs found in TorchNeuron's compile cache, in memory or in the persistent cache (on disk)",
            labels,
            ["tier"],
            [(("memory",), totals["memory"]), (("persistent",), totals["persistent"])],
        )
        yield single_series(
            CounterMetricFamily,
            "torchneuron_compile_cache_misses",
            "NEFFs found in neither cache, compiled by neuronx-cc",
            labels,
            totals["misses"],
        )
        yield self._labelled(
            "torchneuron_compilations",
            "neuronx-cc compilations: of torch.compile graphs (during a dynamo compilation) or of eager operators' "
            "kernels",
            labels,
            ["kind"],
            [(("graph",), totals["graph"]), (("eager_op",), totals["eager_op"])],
        )
        yield self._labelled(
            "torchneuron_compile_seconds",
            "Time neuronx-cc spent compiling, of torch.compile graphs or of eager operators' kernels",
            labels,
            ["kind"],
            [(("graph",), totals["graph_seconds"]), (("eager_op",), totals["eager_op_seconds"])],
        )

    def _cache_values(self) -> dict[str, float]:
        stats, graph = self.source.window.read()  # together: the graphs' part of these statistics
        memory_hits = float(stats.get("in_memory_hits") or 0)
        persistent_hits = float(stats.get("persistent_hits") or 0)
        misses = max(0.0, float(stats.get("in_memory_misses") or 0) - persistent_hits)
        compilations = float(stats.get("total_compilations") or 0)
        seconds = float(stats.get("total_compilation_time_ms") or 0) / 1000
        graph_seconds = graph["compile_ms"] / 1000
        return {
            "memory": memory_hits,
            "persistent": persistent_hits,
            "misses": misses,
            "graph": min(graph["compilations"], compilations),
            "eager_op": max(0.0, compilations - graph["compilations"]),
            "graph_seconds": min(graph_seconds, seconds),
            "eager_op_seconds": max(0.0, seconds - graph_seconds),
        }

    def _graphs(self, labels: dict[str, str]) -> Iterator[Metric]:
        def read() -> dict[str, float]:
            from torch._dynamo.utils import counters

            neuron = dict(counters.get(COUNTERS_KEY) or {})
            return {
                "compiled_graphs": float(neuron.get("compiled_graphs", 0)),
                "graphs_with_collectives": float(neuron.get("graphs_with_collectives", 0)),
            }

        totals = self._totals.read(read)
        yield single_series(
            CounterMetricFamily,
            "torchneuron_compiled_graphs",
            "Graphs the neuron backend of torch.compile compiled (forward and backward, from its cache or not)",
            labels,
            totals["compiled_graphs"],
        )
        yield single_series(
            CounterMetricFamily,
            "torchneuron_graphs_with_collectives",
            "Compiled graphs with collective operations (all_reduce, all_gather, ...)",
            labels,
            totals["graphs_with_collectives"],
        )

    def _memory(self, labels: dict[str, str]) -> Iterator[Metric]:
        stats: dict = {}

        def value(key: str, part: str | None = None) -> float:
            found = memory_value(stats, key, part)
            return 0.0 if found is None else found

        def read() -> dict[str, float]:
            stats.update(self.source.memory_stats())
            return {"ooms": value("num_ooms"), "retries": value("num_alloc_retries")}

        totals = self._totals.read(read)
        yield single_series(
            GaugeMetricFamily,
            "torchneuron_memory_allocated_bytes",
            "Device memory allocated by tensors now (torch.neuron.memory_stats)",
            labels,
            value("allocated_bytes"),
        )
        yield single_series(
            GaugeMetricFamily,
            "torchneuron_memory_active_peak_bytes",
            "Peak of the device memory in active use since the process started or the user reset it",
            labels,
            value("active_bytes", "peak"),
        )
        yield single_series(
            CounterMetricFamily,
            "torchneuron_memory_ooms",
            "Device allocations that failed for want of memory",
            labels,
            totals["ooms"],
        )
        yield single_series(
            CounterMetricFamily,
            "torchneuron_memory_alloc_retries",
            "Device allocations that succeeded only after freeing cached memory",
            labels,
            totals["retries"],
        )

    def _labelled(
        self,
        name: str,
        documentation: str,
        labels: dict[str, str],
        extra: list[str],
        values: list[tuple[tuple[str, ...], float]],
        family_type: type[CounterMetricFamily | GaugeMetricFamily] = CounterMetricFamily,
    ) -> Metric:
        """One family of ``values`` by extra label values (those the budget sent to ``other`` summed; 1 for a gauge)."""
        family = family_type(name, documentation, labels=list(labels) + extra)
        summed: dict[tuple[str, ...], float] = {}
        for key, value in values:
            summed[key] = summed.get(key, 0) + value if family_type is CounterMetricFamily else 1
        for key, value in sorted(summed.items()):
            family.add_metric(list(labels.values()) + list(key), value)
        return family
