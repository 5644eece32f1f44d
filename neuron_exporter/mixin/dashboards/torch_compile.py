"""The "torch.compile" dashboard: what dynamo compiles, recompiles and breaks, by function and line, whatever the
backend (inductor, aot_eager, torch_xla's openxla, a vendor's)."""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard, Row
from grafana_foundation_sdk.models import dashboard as model

from ...catalogue import (
    COMPILE_COMPILATIONS,
    COMPILE_GRAPH_BREAKS,
    COMPILE_LIMIT_HITS,
    COMPILE_RECOMPILATIONS,
    COMPILE_SECONDS,
    TRAINING_STEP_DURATION,
    TRAINING_STEPS,
)
from ..config import DEFAULTS, Config
from .panels import (
    BY_RANK,
    RANK_LEGEND,
    Queries,
    dashboard_links,
    finish,
    graph,
    merged_table,
    note,
    single_stat,
    variables,
)

UID = "neuron-exporter-torch-compile"

SITE_REASON_COLUMNS = {"run_id": "Run", "location": "Site", "reason": "Reason"}
SITE_COLUMNS = {"run_id": "Run", "location": "Site"}
SITES = (
    "A function's site is its first line (a compiled module: the line that called it); a graph break's site "
    "is the user line that broke the graph; other when the exporter's label budget is full. neuron-exporter "
    "diagnose URL (or the endpoint's /diagnosis page) shows the guard that failed and dynamo's full reason."
)

COMPILE_TEXT = """
**What it means.** `torch.compile` (dynamo) turns each Python function it compiles into graphs, guarded by
checks on the inputs (shapes, dtypes, Python values). A *recompilation* happens when a guard fails: the function
is compiled again for the new input, and the step waits. After `torch._dynamo.config.recompile_limit`
recompilations (8 by default) the function *hits the recompile limit* and runs eagerly, uncompiled, from then on.
A *graph break* is a line dynamo cannot put in a graph (`print`, an `if` on a tensor's value, `.item()`, an
unsupported call): the function is split into several graphs with Python in between, at every call. Graph breaks
and recompilations are counted when dynamo compiles, so after warm-up both should stay flat.

**What to do.** *Recompilations by function* names the function and the kind of guard that failed:
`size_mismatch` (mark the dimension dynamic with `torch._dynamo.mark_dynamic(x, 0)` or `dynamic=True`, or pad to
a few fixed shapes), `value_changed` (a Python int or float argument changed: pass it as a tensor), `dtype_` /
`device_` / `requires_grad_mismatch`, `global_state` (grad mode: compile train and eval steps separately).
*Graph breaks by line* names each breaking line and why; compile with `fullgraph=True` to make the first break an
error while you remove them. `neuron-exporter diagnose URL` shows the guards and dynamo's messages.
"""


def watched(q: Queries, by: str) -> str:
    """0 for each run (or rank) whose ranks report torch.compile, from the series every such rank exports
    (``torch_compile_compile_seconds_total``, 0 until something compiles)."""
    return f"0 * sum by ({by}) ({COMPILE_SECONDS.name}{{{q.rank}}})"


def or_none_found(q: Queries, expr: str, by: str = "run_id") -> str:
    """``expr``, or 0 for a watched run (or rank) that has none of it: the panel says the run was watched and nothing
    was found, instead of showing no data."""
    return f"({expr}) or on ({by}) {watched(q, by)}"


def summary_row(board: Dashboard, c: Config, q: Queries) -> Dashboard:
    def in_range(metric: str) -> str:
        return f"sum(increase({metric}{{{q.rank}}}[$__range])) or vector(0)"

    return (
        board.with_row(Row("torch.compile summary"))
        .with_panel(
            single_stat(
                "Compilations in range",
                "Frames compiled by torch.compile in the selected time range, all "
                "selected ranks: first compilations and recompilations.",
                "short",
                in_range(COMPILE_COMPILATIONS.name),
                width=6,
            )
        )
        .with_panel(
            single_stat(
                "torch.compile recompilations in range",
                "Recompilations (a guard of the compiled code failed) in "
                "the selected time range, all selected ranks. A stable training loop has none after warm-up.",
                "short",
                in_range(COMPILE_RECOMPILATIONS.name),
                steps=((None, "green"), (1, "orange"), (10, "red")),
                width=6,
            )
        )
        .with_panel(
            single_stat(
                "Graph breaks in range",
                "Graph breaks found while compiling in the selected time range, all "
                "selected ranks. Each one splits a compiled function at every call.",
                "short",
                in_range(COMPILE_GRAPH_BREAKS.name),
                steps=((None, "green"), (1, "orange")),
                width=6,
            )
        )
        .with_panel(
            single_stat(
                "Functions at the recompile limit",
                "Compiled functions that hit the recompile limit on the "
                "selected ranks and run without compiling from then on (counted once per function and process).",
                "short",
                f"sum({COMPILE_LIMIT_HITS.name}{{{q.rank}}}) or vector(0)",
                steps=((None, "green"), (1, "red")),
                width=6,
            )
        )
    )


def where_row(board: Dashboard, c: Config, q: Queries) -> Dashboard:
    return (
        board.with_row(Row("Where: functions and lines"))
        .with_panel(
            note(
                "torch.compile: what it means, what to do",
                "How to read and fix the torch.compile panels of this dashboard.",
                COMPILE_TEXT,
                height=11,
            )
        )
        .with_panel(
            merged_table(
                "Recompilations by function",
                "Recompilations in the selected time range per run, compiled function "
                "(its first line) and kind of failed guard (size_mismatch, value_changed, dtype_mismatch, ...), "
                "and how many ranks recompiled there. " + SITES,
                "short",
                SITE_REASON_COLUMNS,
                (
                    or_none_found(q, f"{q.increase(COMPILE_RECOMPILATIONS.name, 'run_id, location, reason')} > 0"),
                    "Recompilations in range",
                    None,
                ),
                (
                    or_none_found(q, q.ranks_with(COMPILE_RECOMPILATIONS.name, "location, reason")),
                    "Ranks",
                    None,
                ),
            )
        )
        .with_panel(
            merged_table(
                "Graph breaks by line",
                "Graph breaks found while compiling in the selected time range, per run, "
                "user line and kind of reason (print, data_dependent_branch, tensor_value, unsupported_call, ...), "
                "and how many ranks broke there. " + SITES,
                "short",
                SITE_REASON_COLUMNS,
                (
                    or_none_found(q, f"{q.increase(COMPILE_GRAPH_BREAKS.name, 'run_id, location, reason')} > 0"),
                    "Graph breaks in range",
                    None,
                ),
                (or_none_found(q, q.ranks_with(COMPILE_GRAPH_BREAKS.name, "location, reason")), "Ranks", None),
            )
        )
        .with_panel(
            merged_table(
                "Functions at the recompile limit by site",
                "Compiled functions that hit the recompile limit and run "
                "without compiling, per run and function (its first line): on how many ranks. " + SITES,
                "short",
                SITE_COLUMNS,
                (
                    or_none_found(
                        q,
                        f"count by (run_id, location) (sum by (run_id, rank, location) "
                        f"({COMPILE_LIMIT_HITS.name}{{{q.rank}}}) > 0)",
                    ),
                    "Ranks",
                    None,
                ),
            )
        )
        .with_panel(
            merged_table(
                "Compilations by function",
                "Frames compiled per run and function (its first line; a compiled "
                "module: the line that called it): per rank since the process started (the mean over the ranks "
                "that compiled it), in the selected time range (all selected ranks), and on how many ranks.",
                "short",
                SITE_COLUMNS,
                (
                    or_none_found(
                        q,
                        f"avg by (run_id, location) (sum by (run_id, rank, location) "
                        f"({COMPILE_COMPILATIONS.name}{{{q.rank}}}))",
                    ),
                    "Per rank",
                    None,
                ),
                (
                    or_none_found(q, q.increase(COMPILE_COMPILATIONS.name, "run_id, location")),
                    "In range",
                    None,
                ),
                (
                    or_none_found(
                        q,
                        f"count by (run_id, location) (sum by (run_id, rank, location) "
                        f"({COMPILE_COMPILATIONS.name}{{{q.rank}}}))",
                    ),
                    "Ranks",
                    None,
                ),
            )
        )
    )


def steps_row(board: Dashboard, c: Config, q: Queries) -> Dashboard:
    """Per training step (``training_steps_total``: rounds of optimizer steps, whatever the backend): a job with no
    torch_xla series at all gets its steps, step time and what compiling costs each step."""

    def per_step(metric: str) -> str:
        return f"{q.rate(metric)} / ({q.rate(TRAINING_STEPS.name)} > 0)"

    return (
        board.with_row(Row("Per training step"))
        .with_panel(
            graph(
                "Training steps per second by rank",
                "Training steps (rounds of torch.optim optimizer steps) per "
                "second on each rank, whatever runs the model.",
                "suffix:steps/s",
                (q.rate(TRAINING_STEPS.name), RANK_LEGEND),
                width=8,
            )
        )
        .with_panel(
            graph(
                "Step time by rank",
                "Average wall time of a training step on each rank.",
                "s",
                (q.ratio(f"{TRAINING_STEP_DURATION.name}_sum", f"{TRAINING_STEP_DURATION.name}_count"), RANK_LEGEND),
                width=8,
            )
        )
        .with_panel(
            graph(
                "Compile time per training step by rank",
                "Seconds spent compiling (dynamo and the backend) per "
                "training step on each rank: what recompiling costs each step.",
                "s",
                (per_step(COMPILE_SECONDS.name), RANK_LEGEND),
                width=8,
            )
        )
        .with_panel(
            graph(
                "torch.compile recompilations per training step by rank",
                "Recompilations per training step on each rank. After warm-up the line should stay at 0.",
                "suffix:compiles/step",
                (or_none_found(q, per_step(COMPILE_RECOMPILATIONS.name), BY_RANK), RANK_LEGEND),
                width=12,
            )
        )
        .with_panel(
            graph(
                "Graph breaks per training step by rank",
                "Graph breaks found per training step on each rank (only "
                "while dynamo compiles: a new shape or function).",
                "suffix:breaks/step",
                (or_none_found(q, per_step(COMPILE_GRAPH_BREAKS.name), BY_RANK), RANK_LEGEND),
                width=12,
            )
        )
    )


def rank_row(board: Dashboard, c: Config, q: Queries) -> Dashboard:
    return (
        board.with_row(Row("By rank"))
        .with_panel(
            graph(
                "torch.compile recompilations per minute by rank",
                "Recompilations per minute on each rank. After "
                "warm-up the line should stay at 0; the recompilation alert fires when it does not for "
                f"{c.torch_compile_recompile_for}.",
                "suffix:compiles/min",
                (or_none_found(q, f"60 * {q.rate(COMPILE_RECOMPILATIONS.name)}", BY_RANK), RANK_LEGEND),
                width=8,
            )
        )
        .with_panel(
            graph(
                "Graph breaks per minute by rank",
                "Graph breaks found per minute on each rank (at compile time, so only while dynamo compiles).",
                "suffix:breaks/min",
                (or_none_found(q, f"60 * {q.rate(COMPILE_GRAPH_BREAKS.name)}", BY_RANK), RANK_LEGEND),
                width=8,
            )
        )
        .with_panel(
            graph(
                "torch.compile compilations per minute by rank",
                "Frames compiled per minute on each rank: first compilations and recompilations.",
                "suffix:compiles/min",
                (or_none_found(q, f"60 * {q.rate(COMPILE_COMPILATIONS.name)}", BY_RANK), RANK_LEGEND),
                width=8,
            )
        )
        .with_panel(
            graph(
                "Share of time compiling by rank",
                "Seconds spent compiling (dynamo and the backend, forward and "
                "backward graphs) per second of wall time, on each rank.",
                "percentunit",
                (q.rate(COMPILE_SECONDS.name), RANK_LEGEND),
                width=12,
            )
        )
        .with_panel(
            graph(
                "Time compiling since the start by rank",
                "Seconds spent compiling since the process started, on "
                "each rank (dynamo and the backend); divided by Compilations by function, what a compilation costs.",
                "s",
                (f"sum by (run_id, rank) ({COMPILE_SECONDS.name}{{{q.rank}}})", RANK_LEGEND),
                width=12,
            )
        )
    )


def build(c: Config = DEFAULTS) -> model.Dashboard:
    """The dashboard for configuration ``c`` (its selector)."""
    q = Queries(c)
    board = (
        Dashboard("neuron-exporter / torch.compile")
        .uid(UID)
        .description(
            "What torch.compile (dynamo) compiles, recompiles and breaks, by function and line, per "
            "run and rank, whatever the backend."
        )
        .tags(["neuron-exporter", "torch-compile"])
        .time("now-1h", "now")
        .refresh("30s")
        .tooltip(model.DashboardCursorSync.CROSSHAIR)
        .links(dashboard_links())
    )
    board = variables(board, q)
    for row in (summary_row, steps_row, where_row, rank_row):
        board = row(board, c, q)
    return finish(board)
