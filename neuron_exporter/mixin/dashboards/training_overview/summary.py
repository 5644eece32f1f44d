"""The "Summary" row: the selected ranks' steps per second, graph cuts, CPU-fallback calls, recompilations and host
reads, and the ranks not running, at a glance."""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard, Row

from ....catalogue import (
    RANK_STATE,
    XLA_DEVICE_TO_HOST,
    XLA_FALLBACK_OPS,
    XLA_GRAPH_CUTS,
    XLA_RECOMPILATIONS,
    XLA_STEPS,
)
from ...config import Config
from ..panels import Queries, single_stat


def row(board: Dashboard, c: Config, q: Queries) -> Dashboard:
    return (
        board.with_row(Row("Summary"))
        .with_panel(
            single_stat(
                "Steps per second",
                "Training steps (optimizer steps) ended per second, averaged over the selected ranks.",
                "suffix:steps/s",
                f"avg({q.rate(XLA_STEPS.name, by='run_id, instance, rank')})",
            )
        )
        .with_panel(
            single_stat(
                "Graph cuts per step",
                "Graphs cut off before the step marker per training step, over the selected "
                "ranks: an .item(), print, if on a tensor or CPU-fallback operator needed a value before the step "
                "ended. 0 is ideal; red at the fragmentation alert threshold.",
                "suffix:cuts/step",
                q.ratio(XLA_GRAPH_CUTS.name, XLA_STEPS.name, by=""),
                steps=((None, "green"), (0.05, "orange"), (c.graph_cuts_per_step, "red")),
            )
        )
        .with_panel(
            single_stat(
                "CPU-fallback calls",
                "Calls of operators without an XLA lowering (run on the CPU) in the "
                "selected time range, all ranks. Anything above 0 fragments the graph.",
                "short",
                f"sum(increase({XLA_FALLBACK_OPS.name}{{{q.rank}}}[$__range])) or vector(0)",
                steps=((None, "green"), (1, "red")),
            )
        )
        .with_panel(
            single_stat(
                "Recompilations after warm-up",
                "Compiler runs after the warm-up steps in the selected time "
                "range, all ranks. A stable training loop has 0.",
                "short",
                f"sum(increase({XLA_RECOMPILATIONS.name}{{{q.rank}}}[$__range])) or vector(0)",
                steps=((None, "green"), (1, "orange"), (10, "red")),
            )
        )
        .with_panel(
            single_stat(
                "Host reads per step",
                "Device-to-host transfers (.item(), print, .cpu(), CPU fallbacks) per "
                "training step over the selected ranks. Each one makes the host wait for the device.",
                "suffix:reads/step",
                q.ratio(XLA_DEVICE_TO_HOST.name, XLA_STEPS.name, by=""),
                steps=((None, "green"), (c.host_reads_per_step, "red")),
            )
        )
        .with_panel(
            single_stat(
                "Ranks not running",
                "Ranks the node endpoint reports as hung or dead.",
                "short",
                f'count({RANK_STATE.name}{{{q.rank}, state!="running"}} == 1) or vector(0)',
                steps=((None, "green"), (1, "red")),
            )
        )
    )
