"""The "Where: top sites" row: the lines with the most graph cuts and recompilations, per run."""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard, Row

from ....catalogue import XLA_GRAPH_CUTS, XLA_RECOMPILATIONS
from ...config import Config
from ..panels import Queries, merged_table


def row(board: Dashboard, c: Config, q: Queries) -> Dashboard:
    return (
        board.with_row(Row("Where: top sites"))
        .with_panel(
            merged_table(
                "Top graph-cut sites",
                "The 5 sites (source lines) and causes with the most graph cuts per training "
                "step in the selected time range, per run (summed over its selected ranks and divided by their "
                "steps), and how many ranks cut there. Every site, host reads and CPU-fallback operators: the "
                "Fragmentation & recompiles dashboard.",
                "suffix:cuts/step",
                {"run_id": "Run", "cause": "Cause", "location": "Site"},
                (q.per_run_step(XLA_GRAPH_CUTS.name, "cause, location"), "Cuts per step", None),
                (q.ranks_with(XLA_GRAPH_CUTS.name, "cause, location"), "Ranks", "short"),
                height=7,
                limit=5,
            )
        )
        .with_panel(
            merged_table(
                "Top recompilation sites",
                "The 5 sites (the lines that ran the recompiled graphs) with the most "
                "recompilations after warm-up in the selected time range, per run, and how many ranks recompiled "
                "there. Which upload changed shape: neuron-exporter diagnose URL.",
                "short",
                {"run_id": "Run", "location": "Site"},
                (f"{q.increase(XLA_RECOMPILATIONS.name, 'run_id, location')} > 0", "Recompilations in range", None),
                (q.ranks_with(XLA_RECOMPILATIONS.name, "location"), "Ranks", None),
                height=7,
                limit=5,
            )
        )
    )
