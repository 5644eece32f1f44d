"""The TorchNeuron families of one training process (``torchneuron_*``), read from the ``NeuronSource`` at scrape
time: nothing here synchronizes the device (see ``names``).

Not ``xla_*`` (there is no XLA in a TorchNeuron process) nor ``neuron_*``/``neuroncore_*`` (AWS's neuron-monitor
exports those). Host reads have the causes and the ``location`` rules of ``xla_host_reads_total``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import Metric

from ... import catalogue
from ...metric_family import MonotonicTotals, labelled_family, readable_family, single_series
from ...untrusted import LabelBudget
from .names import COUNTERS_KEY, RECORDS, cache_lookups, memory_value

# Seconds of eager compilations are a difference of two float totals: it can come out lower by a rounding error.
ROUNDING = 1e-9
# The records read from TorchNeuron's own totals, each kept from going backwards on its own.
TOTALS = ("compile_cache", "compiled_graphs", "memory")
TIERS = ("memory", "persistent", "unknown")  # unknown: a build that reports only the sums of the tiers


class NeuronFamilies:
    def __init__(self, source, max_op_series: int, max_site_series: int):
        """``source``: the ``NeuronSource`` (its ``readable`` records and what it counted)."""
        self.source = source
        self._ops = {name: LabelBudget(max_op_series) for name in ("calls", "seen", "sites")}
        self._sites = {name: LabelBudget(max_site_series) for name in ("host_reads", "sites")}
        self._reasons = LabelBudget(max_site_series)
        self._totals = {record: MonotonicTotals(ROUNDING) for record in TOTALS}

    def clear(self) -> None:
        """A forked child's fresh state: none of the parent's totals, budgets or (maybe held) locks."""
        self._ops = {name: LabelBudget(budget.limit) for name, budget in self._ops.items()}
        self._sites = {name: LabelBudget(budget.limit) for name, budget in self._sites.items()}
        self._reasons = LabelBudget(self._reasons.limit)
        self._totals = {record: MonotonicTotals(ROUNDING) for record in TOTALS}

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
        yield readable_family(catalogue.NEURON_READABLE, labels, RECORDS, readable)
        yield from families

    def _graph_fallbacks(self, labels: dict[str, str]) -> Iterator[Metric]:
        counts, _ = self.source.graph_fallbacks.snapshot()
        values = [((reason,), count) for reason, count in counts.items()]
        yield labelled_family(catalogue.NEURON_GRAPH_FALLBACKS, labels, values, {"reason": self._reasons})

    def _host_reads(self, labels: dict[str, str]) -> Iterator[Metric]:
        values = [
            ((cause, record.location), count)
            for record in self.source.attribution.records()
            for cause, count in record.causes.items()
        ]
        yield labelled_family(catalogue.NEURON_HOST_READS, labels, values, {"location": self._sites["host_reads"]})

    def _fallback_calls(self, labels: dict[str, str]) -> Iterator[Metric]:
        calls, sites = self.source.fallbacks.snapshot()
        yield labelled_family(
            catalogue.NEURON_FALLBACK_CALLS,
            labels,
            [((op,), count) for op, count in calls.items()],
            {"op": self._ops["calls"]},
        )
        yield labelled_family(
            catalogue.NEURON_FALLBACK_SITES,
            labels,
            [((op, location, "backward" if backward else "forward"), 1) for op, location, _, backward in sites],
            {"op": self._ops["sites"], "location": self._sites["sites"]},
        )

    def _fallbacks_seen(self, labels: dict[str, str]) -> Iterator[Metric]:
        seen = [((op,), 1) for op in self.source.fallback_ops_seen()]
        yield labelled_family(catalogue.NEURON_FALLBACK_OPS_SEEN, labels, seen, {"op": self._ops["seen"]})

    def _cache(self, labels: dict[str, str]) -> Iterator[Metric]:
        totals = self._totals["compile_cache"].read(self._cache_values)
        tiers = [((tier,), totals[tier]) for tier in TIERS if tier in totals]
        yield labelled_family(catalogue.NEURON_CACHE_HITS, labels, tiers)
        yield single_series(catalogue.NEURON_CACHE_MISSES, labels, totals["misses"])
        kinds = [(("graph",), totals["graph"]), (("eager_op",), totals["eager_op"])]
        yield labelled_family(catalogue.NEURON_COMPILATIONS, labels, kinds)
        kinds = [(("graph",), totals["graph_seconds"]), (("eager_op",), totals["eager_op_seconds"])]
        yield labelled_family(catalogue.NEURON_COMPILE_SECONDS, labels, kinds)

    def _cache_values(self) -> dict[str, float]:
        stats, graph = self.source.window.read()  # together: the graphs' part of these statistics
        compilations = float(stats.get("total_compilations") or 0)
        seconds = float(stats.get("total_compilation_time_ms") or 0) / 1000
        graph_seconds = graph["compile_ms"] / 1000
        return {
            **cache_lookups(stats),
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

        totals = self._totals["compiled_graphs"].read(read)
        yield single_series(catalogue.NEURON_COMPILED_GRAPHS, labels, totals["compiled_graphs"])
        yield single_series(catalogue.NEURON_GRAPHS_WITH_COLLECTIVES, labels, totals["graphs_with_collectives"])

    def _memory(self, labels: dict[str, str]) -> Iterator[Metric]:
        stats: dict = {}

        def value(key: str, part: str | None = None) -> float:
            found = memory_value(stats, key, part)
            return 0.0 if found is None else found

        def read() -> dict[str, float]:
            stats.update(self.source.memory_stats())
            return {"ooms": value("num_ooms"), "retries": value("num_alloc_retries")}

        totals = self._totals["memory"].read(read)
        yield single_series(catalogue.NEURON_MEMORY_ALLOCATED, labels, value("allocated_bytes"))
        yield single_series(catalogue.NEURON_MEMORY_ACTIVE_PEAK, labels, value("active_bytes", "peak"))
        yield single_series(catalogue.NEURON_MEMORY_OOMS, labels, totals["ooms"])
        yield single_series(catalogue.NEURON_MEMORY_RETRIES, labels, totals["retries"])
