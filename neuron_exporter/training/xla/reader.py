"""Reading torch_xla's counters and metrics in the live process.

Two costs matter (see the measured figures in the README): a counter read is O(1), well under a microsecond,
while ``metric_data`` builds the tuple of every retained sample (about 40 ns each, up to 1024). So the step
hook reads only two counters, and the full snapshot is read at scrape time, off the training thread.
None of these calls starts the PJRT runtime or touches the device.
"""

from __future__ import annotations

from collections.abc import Callable

from ...metric_family import MonotonicTotals
from ...snapshot import SECONDS, MetricValue, Snapshot, unit_of
from ...snapshot_metrics import HOST_SCALAR_READ_OP

NANOSECONDS_PER_SECOND = 1e9
CACHED_COMPILE, UNCACHED_COMPILE = "CachedCompile", "UncachedCompile"  # every graph that runs passes one of them
COMPILE_TIME = "CompileTime"  # one sample per compilation: its time, in nanoseconds
GRAPH_SIZE = "TensorsGraphSize"  # one sample per graph that runs: its IR node count
ALIASES = "InputOutputAliasCount"  # one sample per compilation: inputs whose buffers its outputs reuse
MAX_TRAITS = 16


class XlaReader:
    def __init__(self):
        import torch_xla

        xlac = torch_xla._XLAC
        self.counter_value = xlac._xla_counter_value  # name -> value, None if unknown or 0; the hot paths call it
        self._counter_names = xlac._xla_counter_names
        self._metric_names = xlac._xla_metric_names
        self._metric_data = xlac._xla_metric_data
        self._fallback_ops = xlac._get_executed_fallback_ops
        self._aliases_read = 0.0  # the time of the last InputOutputAliasCount sample taken

    def counter(self, name: str) -> int:
        return self.counter_value(name) or 0

    def fallback_counts(self) -> dict[str, int]:
        """Executions of each CPU-fallback operator so far (every namespace; a few counter reads)."""
        return {name: self.counter(name) for name in self._fallback_ops() if name != HOST_SCALAR_READ_OP}

    def compile_counters(self) -> tuple[int, int]:
        """(graphs run = CachedCompile + UncachedCompile, UncachedCompile) now: where the step hook starts counting.
        The step marker's wrapper and the host reads read the same two counters themselves (``counter_value``)."""
        value = self.counter_value
        uncached = value(UNCACHED_COMPILE) or 0
        return (value(CACHED_COMPILE) or 0) + uncached, uncached

    def graph_traits(self, graphs: int, compiles: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """What the graphs just run are made of, which other shapes or Python values do not change: the IR node counts
        of the last ``graphs`` graphs, and the aliased inputs of the last ``compiles`` compilations (each at most
        MAX_TRAITS, oldest first). It reads every retained sample (tens of microseconds): call it only after a
        compilation."""
        sizes = self._last_samples(GRAPH_SIZE, graphs)
        aliases = self._last_samples(ALIASES, compiles, after=self._aliases_read)
        if aliases:
            self._aliases_read = aliases[-1][0]
        return tuple(int(value) for _, value in sizes), tuple(int(value) for _, value in aliases)

    def compile_seconds(self, compilations: int) -> float:
        """The time of the last ``compilations`` compilations (those retained). It reads every retained sample: call it
        only after a compilation."""
        data = self._metric_data(COMPILE_TIME) if compilations > 0 else None
        if not data:
            return 0.0
        return sum(value for _, value in data[2][-compilations:]) / NANOSECONDS_PER_SECOND

    def compilations_ended_since(self, wall_time: float) -> int:
        """How many of the retained compilations ended (got their ``CompileTime`` sample) at or after ``wall_time``
        (``time.time()``). It reads every retained sample: for reads of the ledger, not the training thread."""
        data = self._metric_data(COMPILE_TIME)
        return sum(1 for stamp, _ in data[2] if stamp >= wall_time) if data else 0

    def _last_samples(self, name: str, count: int, after: float = 0.0) -> list[tuple[float, float]]:
        data = self._metric_data(name) if count > 0 else None
        if not data:
            return []
        # A sample older than the last one taken belongs to an earlier compilation: a path that samples none.
        return [sample for sample in data[2][-min(count, MAX_TRAITS) :] if sample[0] > after]

    def snapshot(self) -> Snapshot:
        snapshot = Snapshot()
        for name in self._counter_names():
            snapshot.counters[name] = self.counter(name)
        for name in self._metric_names():
            data = self._metric_data(name)
            if data is None:
                continue
            total_samples, accumulator = data[0], data[1]
            unit = unit_of(name)
            if unit == SECONDS:
                accumulator /= NANOSECONDS_PER_SECOND
            snapshot.metrics[name] = MetricValue(int(total_samples), float(accumulator), unit)
        return snapshot


class MonotonicSnapshots:
    """torch_xla's counters and metrics as totals that never go backwards when the user calls
    ``met.clear_counters()``/``clear_metrics()`` (``MonotonicTotals``, which says how); safe to read from many threads
    at once."""

    def __init__(self):
        self._totals = MonotonicTotals()
        self._units: dict[str, str] = {}

    def read(self, read_snapshot: Callable[[], Snapshot]) -> Snapshot:
        """A fresh snapshot from ``read_snapshot`` turned into totals."""
        return self._result(self._totals.read(lambda: self._values(read_snapshot())))

    def apply(self, snapshot: Snapshot) -> Snapshot:
        """Totals for ``snapshot``, which must be newer than every snapshot applied before (the tests' way in; the
        exporter reads through ``read``)."""
        return self._result(self._totals.apply(self._values(snapshot)))

    def _values(self, snapshot: Snapshot) -> dict[tuple[str, str], float]:
        values: dict[tuple[str, str], float] = {("counter", n): v for n, v in snapshot.counters.items()}
        for name, metric in snapshot.metrics.items():
            values[("samples", name)] = metric.total_samples
            values[("sum", name)] = metric.accumulator
            self._units[name] = metric.unit
        return values

    def _result(self, totals: dict[tuple[str, str], float]) -> Snapshot:
        result = Snapshot()
        for (kind, name), total in totals.items():
            if kind == "counter":
                result.counters[name] = int(total)
            elif kind == "samples":
                result.metrics[name] = MetricValue(int(total), totals[("sum", name)], self._units[name])
        return result
