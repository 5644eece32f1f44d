"""Metric families holding the series of this process, labelled with its rank labels."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric


def single_series(
    family_type: type[CounterMetricFamily | GaugeMetricFamily],
    name: str,
    documentation: str,
    labels: dict[str, str],
    value: float,
) -> Metric:
    family = family_type(name, documentation, labels=list(labels))
    family.add_metric(list(labels.values()), value)
    return family


def histogram_family(name: str, documentation: str, labels: dict[str, str], histogram) -> HistogramMetricFamily:
    """``histogram``: a ``step_tracker.Histogram`` (its cumulative buckets and sum)."""
    family = HistogramMetricFamily(name, documentation, labels=list(labels))
    family.add_metric(list(labels.values()), histogram.cumulative(), histogram.total)
    return family


def readable_family(
    name: str, documentation: str, labels: dict[str, str], records: Iterable[str], readable
) -> GaugeMetricFamily:
    """Which records of a library's private or version-bound API a source reads in this process: 1 each it reads,
    0 each it cannot (the source logs why once), labelled by ``record``."""
    family = GaugeMetricFamily(name, documentation, labels=[*labels, "record"])
    for record in records:
        family.add_metric([*labels.values(), record], float(record in readable))
    return family
