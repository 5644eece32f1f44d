"""Metric families holding the one series of this process, labelled with its rank labels."""

from __future__ import annotations

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
