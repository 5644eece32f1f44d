"""The "Compile and execute" row: the step time's shares of compiling and executing, graphs per step, and compilations
per minute."""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard, Row

from ....catalogue import (
    XLA_COMPILATIONS,
    XLA_COMPILE_SECONDS,
    XLA_EXECUTE_SECONDS,
    XLA_GRAPHS_PER_STEP,
    XLA_NEW_GRAPHS,
    XLA_RECOMPILATIONS,
    XLA_STEP_DURATION,
)
from ...config import Config
from ..panels import RANK_LEGEND, Queries, graph


def row(board: Dashboard, c: Config, q: Queries) -> Dashboard:
    return (
        board.with_row(Row("Compile and execute"))
        .with_panel(
            graph(
                "Compile vs execute share of step time",
                "Share of each rank's step wall time spent compiling "
                "graphs (CompileTime) and executing them (ExecuteTime). Compilation should vanish after warm-up.",
                "percentunit",
                (q.ratio(XLA_COMPILE_SECONDS.name, f"{XLA_STEP_DURATION.name}_sum"), "compile, " + RANK_LEGEND),
                (q.ratio(XLA_EXECUTE_SECONDS.name, f"{XLA_STEP_DURATION.name}_sum"), "execute, " + RANK_LEGEND),
                width=8,
            )
        )
        .with_panel(
            graph(
                "Graphs per step by rank",
                "Average number of XLA graphs run per training step on each rank: the "
                "graphs at step markers (several with gradient accumulation) plus the graph cuts.",
                "suffix:graphs/step",
                (q.ratio(f"{XLA_GRAPHS_PER_STEP.name}_sum", f"{XLA_GRAPHS_PER_STEP.name}_count"), RANK_LEGEND),
                width=8,
            )
        )
        .with_panel(
            graph(
                "Compilations per minute",
                "Compiler runs per minute on each rank: all of them, the first "
                "compilations of new graphs (a new code path: an eval loop, a logging step), and recompilations "
                "after warm-up of graphs that compiled before, which mean the graph keeps changing.",
                "suffix:compiles/min",
                (f"60 * {q.rate(XLA_RECOMPILATIONS.name)}", "recompilations, " + RANK_LEGEND),
                (f"60 * {q.rate(XLA_NEW_GRAPHS.name)}", "new graphs, " + RANK_LEGEND),
                (f"60 * {q.rate(XLA_COMPILATIONS.name)}", "all, " + RANK_LEGEND),
                width=8,
            )
        )
    )
