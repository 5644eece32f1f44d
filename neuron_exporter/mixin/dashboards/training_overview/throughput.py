"""The "Throughput and step time" row: steps per second by rank and the step time's percentiles."""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard, Row

from ....catalogue import XLA_STEP_DURATION, XLA_STEPS
from ...config import Config
from ..panels import RANK_LEGEND, Queries, graph


def percentile(q: Queries, quantile: float) -> str:
    return (
        f"histogram_quantile({quantile}, sum by (le) "
        f"(rate({XLA_STEP_DURATION.name}_bucket{{{q.rank}}}[$__rate_interval])))"
    )


def row(board: Dashboard, c: Config, q: Queries) -> Dashboard:
    return (
        board.with_row(Row("Throughput and step time"))
        .with_panel(
            graph(
                "Steps per second by rank",
                "Training steps ended per second on each rank. A rank that falls "
                "behind the others slows every collective operation.",
                "suffix:steps/s",
                (q.rate(XLA_STEPS.name), RANK_LEGEND),
            )
        )
        .with_panel(
            graph(
                "Step time percentiles",
                "Wall time from one training step end to the next "
                "(xla_step_duration_seconds), over the selected ranks: median, 90th and 99th percentile, and mean.",
                "s",
                (percentile(q, 0.5), "p50"),
                (percentile(q, 0.9), "p90"),
                (percentile(q, 0.99), "p99"),
                (q.ratio(f"{XLA_STEP_DURATION.name}_sum", f"{XLA_STEP_DURATION.name}_count", by=""), "mean"),
            )
        )
    )
