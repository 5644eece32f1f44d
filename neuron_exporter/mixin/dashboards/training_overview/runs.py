"""The "Runs" row: each run's ranks, steps per second, and graph cuts and step markers per training step."""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard, Row

from ....catalogue import XLA_GRAPH_CUTS, XLA_STEP_MARKERS, XLA_STEPS
from ...config import Config
from ..panels import BY_RUN, RUN_LEGEND, Queries, graph


def row(board: Dashboard, c: Config, q: Queries) -> Dashboard:
    return (
        board.with_row(Row("Runs"))
        .with_panel(
            graph(
                "Ranks by run",
                "Ranks reporting training steps in each run of the selected job.",
                "short",
                (f"count by ({BY_RUN}) (sum by ({BY_RUN}, instance, rank) ({XLA_STEPS.name}{{{q.rank}}}))", RUN_LEGEND),
                width=6,
            )
        )
        .with_panel(
            graph(
                "Steps per second by run",
                "Training steps ended per second in each run, averaged over its ranks "
                "(the ranks of a run step together).",
                "suffix:steps/s",
                (f"avg by ({BY_RUN}) ({q.rate(XLA_STEPS.name, by=f'{BY_RUN}, instance, rank')})", RUN_LEGEND),
                width=6,
            )
        )
        .with_panel(
            graph(
                "Graph cuts per training step by run",
                "Graphs cut off before the step marker (.item(), print, "
                "an if on a tensor, a CPU fallback) per training step in each run, over its ranks. The dashed line "
                "is the fragmentation alert threshold, which fires when any one rank reaches it.",
                "suffix:cuts/step",
                (q.ratio(XLA_GRAPH_CUTS.name, XLA_STEPS.name, by=BY_RUN), RUN_LEGEND),
                width=6,
                threshold=c.graph_cuts_per_step,
            )
        )
        .with_panel(
            graph(
                "Step markers per training step by run",
                "Step markers that ran a graph (mark_step, sync, the "
                "loaders) per training step in each run. 1 is a marker per step; gradient accumulation with a "
                "marker per micro-batch shows one per micro-batch, which is not fragmentation.",
                "suffix:markers/step",
                (q.ratio(XLA_STEP_MARKERS.name, XLA_STEPS.name, by=BY_RUN), RUN_LEGEND),
                width=6,
            )
        )
    )
