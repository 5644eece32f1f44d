"""The family kit: a catalogue entry (``catalogue``) made into a ``prometheus_client`` family with its series, the
series of a labelled family kept within a label budget (``untrusted.LabelBudget``, the rest in ``other``), and
totals kept from going backwards when the library they are read from resets its own."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import TypeVar

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from . import fork_safe
from .catalogue import COUNTER, GAUGE, Family, catalogued
from .untrusted import LabelBudget

KINDS = {COUNTER: CounterMetricFamily, GAUGE: GaugeMetricFamily}

Key = TypeVar("Key", bound=Hashable)


def new_family(family: Family, labels: Mapping[str, str]) -> Metric:
    """An empty family of the catalogue's ``family``, its series labelled ``labels`` (the rank's) and its own."""
    if not catalogued(family):
        raise ValueError(f"{family.name} is not in the catalogue (neuron_exporter/catalogue.py)")
    names = [*labels, *family.labels]
    if family.type in KINDS:
        return KINDS[family.type](family.name, family.help, labels=names)
    return HistogramMetricFamily(family.name, family.help, labels=names)


def single_series(family: Family, labels: Mapping[str, str], value: float) -> Metric:
    """A family of one series: a counter's or a gauge's ``value``."""
    metric = new_family(family, labels)
    metric.add_metric(list(labels.values()), value)  # type: ignore[attr-defined]
    return metric


def histogram_family(family: Family, labels: Mapping[str, str], histogram) -> Metric:
    """``histogram``: a ``training.histogram.Histogram`` (its cumulative buckets and sum)."""
    metric = new_family(family, labels)
    metric.add_metric(list(labels.values()), histogram.cumulative(), histogram.total)  # type: ignore[attr-defined]
    return metric


def labelled_family(
    family: Family,
    labels: Mapping[str, str],
    values: Iterable[tuple[tuple[str, ...], float]],
    budgets: Mapping[str, LabelBudget] | None = None,
) -> Metric:
    """One series per distinct value of the family's own labels: ``values`` are (label values, value). A label with
    a budget keeps the values it admits and the rest become ``other``; series that fall together add up (a
    counter's) or keep the last value (a gauge's: one fact each, such as an ``_info`` series' 1)."""
    metric = new_family(family, labels)
    positions = [(family.labels.index(name), budget) for name, budget in (budgets or {}).items()]
    summed: dict[tuple[str, ...], float] = {}
    for key, value in values:
        if positions:
            key = list(key)  # type: ignore[assignment]
            for index, budget in positions:
                key[index] = budget.label_for(key[index])  # type: ignore[index]
            key = tuple(key)
        summed[key] = summed.get(key, 0) + value if family.type == COUNTER else value
    base = list(labels.values())
    for key, value in sorted(summed.items()):
        metric.add_metric(base + list(key), value)  # type: ignore[attr-defined]
    return metric


def readable_family(family: Family, labels: Mapping[str, str], records: Iterable[str], readable) -> Metric:
    """Which records of a library's private or version-bound API a source reads in this process: 1 each it reads,
    0 each it cannot (the source logs why once), labelled by ``record``."""
    metric = new_family(family, labels)
    for record in records:
        metric.add_metric([*labels.values(), record], float(record in readable))  # type: ignore[attr-defined]
    return metric


class MonotonicTotals:
    """Totals of values read from a library's own counters, kept from going backwards when it resets them (the user
    clears torch_xla's counters; TorchNeuron's are reset): a value lower than the last one read is a reset, and what
    was counted before it is kept as an offset. A key that is no longer read reads as 0 (torch_xla drops a cleared
    counter from its lists). A reset between two reads followed by more counting than before goes unnoticed.

    ``rounding``: a drop by at most this share of the last value is not a reset but a rounding error (a total
    derived as a difference of two float totals).

    Reads must be applied in the order they were made: a stale one applied after a newer one would look like a
    reset and add the newer total again. ``read()`` reads and applies under one lock, so concurrent scrapes (an HA
    pair of Prometheus servers, the spool thread) cannot interleave.
    """

    def __init__(self, rounding: float = 0.0):
        self.rounding = rounding
        self._lock = fork_safe.Lock()
        self._last: dict = {}
        self._offset: dict = {}

    def read(self, reader: Callable[[], Mapping[Key, float]]) -> dict[Key, float]:
        """The totals of what ``reader()`` reads now (its exceptions are the caller's)."""
        with self._lock:
            return self._apply(reader())

    def apply(self, values: Mapping[Key, float]) -> dict[Key, float]:
        """The totals of ``values``, which must be newer than every read applied before."""
        with self._lock:
            return self._apply(values)

    def _apply(self, values: Mapping[Key, float]) -> dict[Key, float]:
        current = dict(values)
        for key in self._last.keys() - current.keys():
            current[key] = 0
        totals = {}
        for key, value in current.items():
            last = self._last.get(key, 0)
            if value < last:
                if last - value <= self.rounding * max(1.0, last):
                    value = last
                else:
                    self._offset[key] = self._offset.get(key, 0) + last
            self._last[key] = value
            totals[key] = self._offset.get(key, 0) + value
        return totals
