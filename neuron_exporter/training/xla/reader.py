"""Reading torch_xla's counters and metrics in the live process.

Two costs matter (see the measured figures in the README): a counter read is O(1), well under a microsecond,
while ``metric_data`` builds the tuple of every retained sample (about 40 ns each, up to 1024). So the step
hook reads only two counters, and the full snapshot is read at scrape time, off the training thread.
None of these calls starts the PJRT runtime or touches the device.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

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
    """Keeps exported totals from going backwards when the user calls ``met.clear_counters()``/``clear_metrics()``.

    A value lower than the last one seen means a clear happened; what was counted before it is kept as an
    offset. A clear between two scrapes that is followed by more counting than before goes unnoticed.

    Snapshots must be applied in the order they were read: a stale snapshot applied after a newer one would look
    like a clear and add the newer total again. ``read()`` reads and applies under one lock, so concurrent
    scrapes (an HA pair of Prometheus servers, the spool thread) cannot interleave.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._last: dict[tuple[str, str], float] = {}
        self._offset: dict[tuple[str, str], float] = {}
        self._units: dict[str, str] = {}

    def _total(self, key: tuple[str, str], value: float) -> float:
        if value < self._last.get(key, 0):
            self._offset[key] = self._offset.get(key, 0) + self._last[key]
        self._last[key] = value
        return self._offset.get(key, 0) + value

    def read(self, read_snapshot: Callable[[], Snapshot]) -> Snapshot:
        """A fresh snapshot from ``read_snapshot`` turned into totals; safe to call from many threads at once."""
        with self._lock:
            return self._apply(read_snapshot())

    def apply(self, snapshot: Snapshot) -> Snapshot:
        """Totals for ``snapshot``, which must be newer than every snapshot applied before (the tests' way in; the
        exporter reads through ``read``)."""
        with self._lock:
            return self._apply(snapshot)

    def _apply(self, snapshot: Snapshot) -> Snapshot:
        current: dict[tuple[str, str], float] = {("counter", n): v for n, v in snapshot.counters.items()}
        for name, metric in snapshot.metrics.items():
            current[("samples", name)] = metric.total_samples
            current[("sum", name)] = metric.accumulator
            self._units[name] = metric.unit
        # A cleared counter or metric vanishes from torch_xla's lists: it reads as 0 and keeps its offset.
        for key in self._last.keys() - current.keys():
            current[key] = 0
        totals = {key: self._total(key, value) for key, value in current.items()}
        result = Snapshot()
        for (kind, name), total in totals.items():
            if kind == "counter":
                result.counters[name] = int(total)
            elif kind == "samples":
                result.metrics[name] = MetricValue(int(total), totals[("sum", name)], self._units[name])
        return result
