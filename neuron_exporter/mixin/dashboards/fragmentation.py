"""The "Fragmentation & recompiles" dashboard: one row per problem, each opening with what it means and what to
do, then where it happens (by site: the source line, and cause; or by operator), then the evidence by run and
rank."""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard, Row
from grafana_foundation_sdk.models import dashboard as model

from ...catalogue import (
    NEURON_HOST_READS,
    TRAINING_STEPS,
    XLA_COMPILATIONS,
    XLA_COMPILE_SECONDS,
    XLA_DEVICE_TO_HOST,
    XLA_FALLBACK_OPS,
    XLA_FALLBACK_SITES,
    XLA_FRAGMENTED_STEPS,
    XLA_FROM_DEVICE_SECONDS,
    XLA_GRAPH_CACHE_HITS,
    XLA_GRAPH_CUTS,
    XLA_GRAPHS_PER_STEP,
    XLA_HOST_READS,
    XLA_HOST_SCALAR_READS,
    XLA_HOST_TO_DEVICE,
    XLA_NEW_GRAPHS,
    XLA_RECOMPILATIONS,
    XLA_STEP_DURATION,
    XLA_STEP_MARKERS,
    XLA_STEPS,
)
from ..config import DEFAULTS, Config
from .panels import RANK_LEGEND, Queries, dashboard_links, finish, graph, instant_table, merged_table, note, variables

ALL_STEPS = TRAINING_STEPS.name  # the training steps of every backend (TorchNeuron's host reads are per these)
UID = "neuron-exporter-fragmentation"

OP_LEGEND = "{{op}}, " + RANK_LEGEND
SITE_LEGEND = "{{location}} {{run_id}}"
SITE_COLUMNS = {"run_id": "Run", "location": "Site"}
CAUSE_SITE_COLUMNS = {"run_id": "Run", "cause": "Cause", "location": "Site"}
SITES = (
    "A site is the source line that made the graph run: the innermost line outside torch, torch_xla and "
    "the standard library (yours, or a library's such as transformers/...); unknown when there is no Python "
    "line (a CPU fallback inside C++, the autograd thread), other when the exporter's label budget is full. "
    "neuron-exporter diagnose URL (or the endpoint's /diagnosis page) lists each site's call stack."
)

FALLBACK_TEXT = """
**What it means.** These operators have no XLA lowering (the `aten::`, `torchvision::` or custom operator
counters of `met.metrics_report()`), so PyTorch/XLA runs them on the host CPU. Every call executes the graph
built so far, copies the operator's inputs to the host, runs it there and copies the result back: the step is
cut into several graphs (fragmentation) and the device sits idle while the host works.

**What to do.** Find the operator in the model code (*Fallback operators* names it, how often it runs per step
and on how many ranks; the table beside it names the ranks). Rewrite it with supported operations, move it out
of the training step (for example into data preparation on the CPU), or ask for a lowering of the operator.
`neuron_parallel_compile --command analyze python train.py` lists unsupported operators before a long run.
`.item()` (`aten::_local_scalar_dense`) is not counted here: it is a host read, shown in the next row.
"""

GRAPH_CUT_TEXT = """
**What it means.** A training step should end with one graph at the step marker. Reading device data on the
host (`.item()`, `print(tensor)`, `.cpu()`, `.tolist()`, an `if` on a tensor value) runs the graph built so far
before the marker and waits for its result: a *graph cut*, and the host stalls on the device. CPU-fallback
operators (row above) cut the graph the same way. *Graph cuts per training step* is what the fragmentation alert
watches; one cut every step (a check inside the forward pass) is enough to fire it. Several step markers per
step (gradient accumulation with a marker per micro-batch, a marker after backward and one after the optimizer)
run several graphs without any cut: that is not fragmentation.

**What to do.** Start with *Graph cuts by site*: the source line and cause of each cut (`item`, `bool` for an
`if t:`, `print`, `cpu_fallback`, ...), its cuts per step and its ranks; `neuron-exporter diagnose URL` (or the
endpoint's `/diagnosis` page) shows the call stack above each line. Read values after `torch_xla.sync()` /
`xm.mark_step()` instead of before it, log every N steps rather than every step, or pass the tensors to
`xm.add_step_closure()` so they are read once the step's graph has run. Keep data-dependent Python branches out
of the step (`torch.where` instead of `if t:`).
"""

RECOMPILE_TEXT = """
**What it means.** A recompilation is a computation compiled again because its graph changed: usually an input
shape (variable batch or sequence length, a last partial batch) or a Python value baked into the graph (a scalar,
a step counter, a loop bound). Once every shape has been seen, every step should find its graph in the compile
cache. Compiling takes seconds to minutes on Neuron, so recompiling can dominate the step time.

A *new graph* (the first compilation of a code path: an eval loop, a logging step) is not a recompilation.

**What to do.** *Recompilations by site* names the line that ran each recompiled graph (usually the step marker,
or a host read that cut the graph); `neuron-exporter diagnose URL` (or the endpoint's `/diagnosis` page) names
the upload whose shape changed, old -> new. Pad inputs to a few fixed sizes (bucketing), drop or pad the last
batch (`drop_last=True`), pass changing scalars as device tensors, and keep control flow independent of the
data. Compile the graphs ahead of time with `neuron_parallel_compile` and keep the persistent compile cache
between runs.
"""


def fallback_row(board: Dashboard, c: Config, q: Queries) -> Dashboard:
    op = q.rank + ', op=~"$op"'
    return (
        board.with_row(Row("CPU-fallback operators"))
        .with_panel(
            note(
                "CPU-fallback operators: what they mean, what to do",
                "How to read and fix the CPU-fallback operator panels of this row.",
                FALLBACK_TEXT,
            )
        )
        .with_panel(
            merged_table(
                "Fallback operators",
                "Each operator without an XLA lowering that ran in the selected time range, "
                "per run: its calls per training step (summed over the run's selected ranks and divided by their "
                "steps: 1 = once in every step of every rank) and how many ranks called it.",
                "suffix:calls/step",
                {"run_id": "Run", "op": "Operator"},
                (q.per_run_step(XLA_FALLBACK_OPS.name, "op", matchers=op), "Calls per step", None),
                (q.ranks_with(XLA_FALLBACK_OPS.name, "op", matchers=op), "Ranks", "short"),
            )
        )
        .with_panel(
            instant_table(
                "Where fallback operators are called",
                "The source line of each call of a CPU-fallback operator, "
                "per run, and how many ranks called it there: forward at the line that calls it, backward at the "
                "line that called backward(). Only ranks that run with fallback_sites on "
                "(NEURON_EXPORTER_FALLBACK_SITES=1) report it: it watches one step when an operator first falls back.",
                "short",
                f"count by (run_id, op, location, pass) (last_over_time({XLA_FALLBACK_SITES.name}{{{op}}}[$__range]))",
                {"run_id": "Run", "op": "Operator", "location": "Line", "pass": "Pass"},
                "Ranks",
            )
        )
        .with_panel(
            instant_table(
                "Fallback calls by rank and operator",
                "Calls of each operator without an XLA lowering in the "
                "selected time range, per run, rank and operator.",
                "short",
                q.increase(XLA_FALLBACK_OPS.name, "run_id, rank, op", matchers=op),
                {"run_id": "Run", "rank": "Rank", "op": "Operator"},
                "Calls in range",
            )
        )
        .with_panel(
            graph(
                "Fallback calls per step",
                "Calls of each CPU-fallback operator per training step, per rank. "
                "1 means the operator runs once in every step.",
                "suffix:calls/step",
                (
                    f"{q.rate(XLA_FALLBACK_OPS.name, by='run_id, rank, op', matchers=op)}"
                    f" / on (run_id, rank) group_left {q.rate(XLA_STEPS.name)}",
                    OP_LEGEND,
                ),
            )
        )
        .with_panel(
            graph(
                "Fallback calls per second",
                "Calls per second of each CPU-fallback operator, per rank.",
                "suffix:calls/s",
                (q.rate(XLA_FALLBACK_OPS.name, by="run_id, rank, op", matchers=op), OP_LEGEND),
            )
        )
    )


def graph_cut_row(board: Dashboard, c: Config, q: Queries) -> Dashboard:
    return (
        board.with_row(Row("Graph cuts: .item(), print and host reads"))
        .with_panel(
            note(
                "Graph cuts: what they mean, what to do",
                "How to read and fix the graph-cut panels of this row.",
                GRAPH_CUT_TEXT,
                height=10,
            )
        )
        .with_panel(
            merged_table(
                "Graph cuts by site",
                "Where the graphs are cut, per run: each site and cause (the host read: item, "
                "bool for an if on a tensor, print, ...; cpu_fallback; unattributed when neither was seen) with its "
                "graph cuts per training step in the selected time range (summed over the run's selected ranks and "
                "divided by their steps, so the sites add up to the run's cuts per step) and how many ranks cut "
                "there. " + SITES,
                "suffix:cuts/step",
                CAUSE_SITE_COLUMNS,
                (q.per_run_step(XLA_GRAPH_CUTS.name, "cause, location"), "Cuts per step", None),
                (q.ranks_with(XLA_GRAPH_CUTS.name, "cause, location"), "Ranks", "short"),
            )
        )
        .with_panel(
            merged_table(
                "Host reads by site",
                "Every read of device data by the host from Python, per run, site and cause, "
                "whether or not it cut the graph (a read after the step marker does not), on an XLA device or "
                "TorchNeuron's neuron device: reads per training step in the selected time range (over the run's "
                "selected ranks) and how many ranks read there. " + SITES,
                "suffix:reads/step",
                CAUSE_SITE_COLUMNS,
                (
                    f"({q.per_run_step(XLA_HOST_READS.name, 'cause, location')}) or "
                    f"({q.per_run_step(NEURON_HOST_READS.name, 'cause, location', steps=ALL_STEPS)})",
                    "Reads per step",
                    None,
                ),
                (
                    "count by (run_id, cause, location) ("
                    f"{q.increase(XLA_HOST_READS.name, 'run_id, rank, cause, location')} > 0 or "
                    f"{q.increase(NEURON_HOST_READS.name, 'run_id, rank, cause, location')} > 0)",
                    "Ranks",
                    "short",
                ),
            )
        )
        .with_panel(
            graph(
                "Graph cuts per training step by rank",
                "Graphs run before the step marker (cut off by .item(), "
                "print, an if on a tensor or a CPU fallback) per training step, per rank. The dashed line is the "
                "fragmentation alert threshold.",
                "suffix:cuts/step",
                (q.ratio(XLA_GRAPH_CUTS.name, XLA_STEPS.name), RANK_LEGEND),
                width=8,
                threshold=c.graph_cuts_per_step,
            )
        )
        .with_panel(
            graph(
                "Step markers per training step by rank",
                "Step markers that ran a graph per training step, per "
                "rank: 1 for one mark_step/sync per step, more with gradient accumulation or a marker after "
                "backward. Markers are not cuts.",
                "suffix:markers/step",
                (q.ratio(XLA_STEP_MARKERS.name, XLA_STEPS.name), RANK_LEGEND),
                width=8,
            )
        )
        .with_panel(
            graph(
                "Graphs per step by rank",
                "Average number of XLA graphs run per training step, per rank: the "
                "graphs at step markers plus the graph cuts.",
                "suffix:graphs/step",
                (q.ratio(f"{XLA_GRAPHS_PER_STEP.name}_sum", f"{XLA_GRAPHS_PER_STEP.name}_count"), RANK_LEGEND),
                width=8,
            )
        )
        .with_panel(
            graph(
                "Fragmented steps",
                "Share of training steps with at least one graph cut, per rank.",
                "percentunit",
                (q.ratio(XLA_FRAGMENTED_STEPS.name, XLA_STEPS.name), RANK_LEGEND),
                width=8,
            )
        )
        .with_panel(
            graph(
                "Host reads per step",
                "Device-to-host transfers per training step (all reads, CPU fallbacks "
                "included) and .item() calls per step, per rank.",
                "suffix:reads/step",
                (q.ratio(XLA_DEVICE_TO_HOST.name, XLA_STEPS.name), "all reads, " + RANK_LEGEND),
                (q.ratio(XLA_HOST_SCALAR_READS.name, XLA_STEPS.name), ".item(), " + RANK_LEGEND),
                width=8,
                threshold=c.host_reads_per_step,
            )
        )
        .with_panel(
            graph(
                "Time reading from the device",
                "Share of the step wall time spent in device-to-host transfers (TransferFromDeviceTime), per rank.",
                "percentunit",
                (q.ratio(XLA_FROM_DEVICE_SECONDS.name, f"{XLA_STEP_DURATION.name}_sum"), RANK_LEGEND),
                width=8,
            )
        )
        .with_panel(
            graph(
                "Host-to-device transfers per step",
                "Uploads per training step, per rank: input batches, and the "
                "results of CPU-fallback operators going back to the device.",
                "suffix:transfers/step",
                (q.ratio(XLA_HOST_TO_DEVICE.name, XLA_STEPS.name), RANK_LEGEND),
                width=24,
            )
        )
    )


def recompile_row(board: Dashboard, c: Config, q: Queries) -> Dashboard:
    return (
        board.with_row(Row("Recompilations"))
        .with_panel(
            note(
                "Recompilations: what they mean, what to do",
                "How to read and fix the recompilation panels of this row.",
                RECOMPILE_TEXT,
                height=9,
            )
        )
        .with_panel(
            merged_table(
                "Recompilations by site",
                "Compilations of a computation that compiled before, per run and "
                "site (the line that ran the graph: a step marker, or the host read that cut it): how many in the "
                "selected time range, per training step (over the run's selected ranks) and on how many ranks. The "
                "upload whose shape changed, old -> new: neuron-exporter diagnose URL or the endpoint's /diagnosis "
                "page. " + SITES,
                "short",
                SITE_COLUMNS,
                (f"{q.increase(XLA_RECOMPILATIONS.name, 'run_id, location')} > 0", "Recompilations in range", None),
                (q.per_run_step(XLA_RECOMPILATIONS.name, "location"), "Per step", "suffix:/step"),
                (q.ranks_with(XLA_RECOMPILATIONS.name, "location"), "Ranks", None),
            )
        )
        .with_panel(
            graph(
                "Recompilations per minute by site",
                "Recompilations per minute of the 10 busiest sites, per run (summed over the selected ranks).",
                "suffix:compiles/min",
                (f"topk(10, 60 * {q.rate(XLA_RECOMPILATIONS.name, by='run_id, location')})", SITE_LEGEND),
            )
        )
        .with_panel(
            graph(
                "Recompilations per step",
                "Recompilations (compilations of a computation that compiled "
                "before, for other shapes or values) per training step, per rank. The dashed line is the "
                "recompilation-storm alert threshold.",
                "suffix:compiles/step",
                (q.ratio(XLA_RECOMPILATIONS.name, XLA_STEPS.name), RANK_LEGEND),
                width=8,
                threshold=c.recompilations_per_step,
            )
        )
        .with_panel(
            graph(
                "Compile share of step time",
                "Share of the step wall time spent compiling, per rank. The dashed "
                "line is the compile-time alert threshold.",
                "percentunit",
                (q.ratio(XLA_COMPILE_SECONDS.name, f"{XLA_STEP_DURATION.name}_sum"), RANK_LEGEND),
                width=8,
                threshold=c.compile_time_share,
            )
        )
        .with_panel(
            graph(
                "Mean time per compilation",
                "Compile time of one graph on average since the process started, "
                "per rank: what each recompilation costs.",
                "s",
                (
                    f"sum by (run_id, rank) ({XLA_COMPILE_SECONDS.name}{{{q.rank}}})"
                    f" / sum by (run_id, rank) ({XLA_COMPILATIONS.name}{{{q.rank}}})",
                    RANK_LEGEND,
                ),
                width=8,
            )
        )
        .with_panel(
            merged_table(
                "New graphs by site",
                "First compilations of a graph, per run and site (a new code path: the first "
                "steps, an eval loop, a logging step): per rank since the process started (the mean over the ranks "
                "that compiled there), in the selected time range (all selected ranks) and on how many ranks. New "
                "graphs are expected once each and are not recompilations: the recompilation alert does not count "
                "them.",
                "short",
                SITE_COLUMNS,
                (
                    f"avg by (run_id, location) (sum by (run_id, rank, location) ({XLA_NEW_GRAPHS.name}{{{q.rank}}}))",
                    "Per rank",
                    None,
                ),
                (q.increase(XLA_NEW_GRAPHS.name, "run_id, location"), "In range", None),
                (
                    "count by (run_id, location) "
                    f"(sum by (run_id, rank, location) ({XLA_NEW_GRAPHS.name}{{{q.rank}}}))",
                    "Ranks",
                    None,
                ),
            )
        )
        .with_panel(
            instant_table(
                "Recompilations by rank",
                "Recompilations (compilations of a computation that compiled "
                "before) in the selected time range, per run and rank, summed over their sites.",
                "short",
                q.increase(XLA_RECOMPILATIONS.name, "run_id, rank"),
                {"run_id": "Run", "rank": "Rank"},
                "Recompilations in range",
            )
        )
        .with_panel(
            graph(
                "Compile cache",
                "Graphs served from the compile cache and graphs compiled (new graphs and "
                "recompilations), per second, per rank.",
                "suffix:graphs/s",
                (q.rate(XLA_GRAPH_CACHE_HITS.name), "cache hits, " + RANK_LEGEND),
                (q.rate(XLA_COMPILATIONS.name), "compiled, " + RANK_LEGEND),
                width=24,
            )
        )
    )


def build(c: Config = DEFAULTS) -> model.Dashboard:
    """The dashboard for configuration ``c`` (its selector, and the alert thresholds drawn on its panels)."""
    q = Queries(c)
    board = (
        Dashboard("neuron-exporter / Fragmentation & recompiles")
        .uid(UID)
        .description(
            "Why PyTorch/XLA steps run more than one graph or recompile: CPU-fallback operators, "
            "host reads such as .item(), and changing graphs, by run, rank and operator."
        )
        .tags(["neuron-exporter", "pytorch-xla"])
        .time("now-1h", "now")
        .refresh("30s")
        .tooltip(model.DashboardCursorSync.CROSSHAIR)
        .links(dashboard_links())
    )
    board = variables(board, q, with_op=True)
    for row in (fallback_row, graph_cut_row, recompile_row):
        board = row(board, c, q)
    return finish(board)
