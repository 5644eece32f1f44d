"""The "Host reads and CPU fallback" row: device-to-host transfers per step by rank and the top CPU-fallback
operators."""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard, Row

from ....catalogue import XLA_DEVICE_TO_HOST, XLA_FALLBACK_OPS, XLA_HOST_SCALAR_READS, XLA_STEPS
from ...config import Config
from ..panels import RANK_LEGEND, Queries, graph, instant_table


def row(board: Dashboard, c: Config, q: Queries) -> Dashboard:
    return (
        board.with_row(Row("Host reads and CPU fallback"))
        .with_panel(
            graph(
                "Host reads per step by rank",
                "Device-to-host transfers per training step (every read of device "
                "data by the host, CPU fallbacks included) and .item() calls per step, on each rank.",
                "suffix:reads/step",
                (q.ratio(XLA_DEVICE_TO_HOST.name, XLA_STEPS.name), "all reads, " + RANK_LEGEND),
                (q.ratio(XLA_HOST_SCALAR_READS.name, XLA_STEPS.name), ".item(), " + RANK_LEGEND),
                threshold=c.host_reads_per_step,
            )
        )
        .with_panel(
            instant_table(
                "Top CPU-fallback operators",
                "Operators without an XLA lowering, by calls per second over the "
                "selected time range, all selected ranks. Drill down in the Fragmentation & recompiles dashboard.",
                "suffix:calls/s",
                f"topk(10, sum by (op) (rate({XLA_FALLBACK_OPS.name}{{{q.rank}}}[$__range])))",
                {"op": "Operator"},
                "Calls per second",
            )
        )
    )
