"""The "Fragmentation & recompiles" dashboard: one row per problem, each opening with what it means and what to
do, then the evidence by run, rank and operator."""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard, Row
from grafana_foundation_sdk.models import dashboard as model

from .config import DEFAULTS, Config
from .panels import RANK_LEGEND, Queries, dashboard_links, finish, graph, instant_table, note, variables

UID = "neuron-exporter-fragmentation"

OP_LEGEND = "{{op}}, " + RANK_LEGEND

FALLBACK_TEXT = """
**What it means.** These operators have no XLA lowering (the `aten::` counters of `met.metrics_report()`), so
PyTorch/XLA runs them on the host CPU. Every call executes the graph built so far, copies the operator's inputs
to the host, runs it there and copies the result back: the step is cut into several graphs (fragmentation) and
the device sits idle while the host works.

**What to do.** Find the operator in the model code (the table names it and the rank). Rewrite it with supported
operations, move it out of the training step (for example into data preparation on the CPU), or ask for a
lowering of the operator. `neuron_parallel_compile --command analyze python train.py` lists unsupported
operators before a long run. `.item()` (`aten::_local_scalar_dense`) is not counted here: it is a host read,
shown in the next row.
"""

GRAPH_CUT_TEXT = """
**What it means.** A training step should end with one graph at the step marker. Reading device data on the
host (`.item()`, `print(tensor)`, `.cpu()`, `.tolist()`, an `if` on a tensor value) runs the graph built so far
before the marker and waits for its result: a *graph cut*, and the host stalls on the device. CPU-fallback
operators (row above) cut the graph the same way. *Graph cuts per training step* is what the fragmentation alert
watches; one cut every step (a check inside the forward pass) is enough to fire it. Several step markers per
step (gradient accumulation with a marker per micro-batch, a marker after backward and one after the optimizer)
run several graphs without any cut: that is not fragmentation.

**What to do.** Read values after `torch_xla.sync()` / `xm.mark_step()` instead of before it, log every N steps
rather than every step, or pass the tensors to `xm.add_step_closure()` so they are read once the step's graph
has run. Keep data-dependent Python branches out of the step (`torch.where` instead of `if t:`).
"""

RECOMPILE_TEXT = """
**What it means.** After the warm-up steps (`neuron_exporter_warmup_steps`) every step should find its graph in
the compile cache. A compiler run after warm-up means the graph changed: usually an input shape (variable batch
or sequence length, a last partial batch) or a Python value baked into the graph (a scalar, a step counter, a
loop bound). Compiling takes seconds to minutes on Neuron, so recompiling can dominate the step time.

**What to do.** Pad inputs to a few fixed sizes (bucketing), drop or pad the last batch (`drop_last=True`), pass
changing scalars as device tensors, and keep control flow independent of the data. Compile the graphs ahead of
time with `neuron_parallel_compile` and keep the persistent compile cache between runs.
"""


def fallback_row(board: Dashboard, c: Config, q: Queries) -> Dashboard:
    op = q.rank + ', op=~"$op"'
    return (board.with_row(Row("CPU-fallback operators"))
            .with_panel(note("CPU-fallback operators: what they mean, what to do",
                             "How to read and fix the CPU-fallback operator panels of this row.", FALLBACK_TEXT))
            .with_panel(instant_table(
                "Fallback calls by rank and operator", "Calls of each operator without an XLA lowering in the "
                "selected time range, per run, rank and operator.",
                "short", q.increase("xla_cpu_fallback_ops_total", "run_id, rank, op", matchers=op),
                {"run_id": "Run", "rank": "Rank", "op": "Operator"}, "Calls in range"))
            .with_panel(graph(
                "Fallback calls per step", "Calls of each CPU-fallback operator per training step, per rank. "
                "1 means the operator runs once in every step.",
                "suffix:calls/step",
                (f"{q.rate('xla_cpu_fallback_ops_total', by='run_id, rank, op', matchers=op)}"
                 f" / on (run_id, rank) group_left {q.rate('xla_steps_total')}", OP_LEGEND)))
            .with_panel(graph(
                "Fallback calls per second", "Calls per second of each CPU-fallback operator, per rank.",
                "suffix:calls/s",
                (q.rate("xla_cpu_fallback_ops_total", by="run_id, rank, op", matchers=op), OP_LEGEND),
                width=24)))


def graph_cut_row(board: Dashboard, c: Config, q: Queries) -> Dashboard:
    return (board.with_row(Row("Graph cuts: .item(), print and host reads"))
            .with_panel(note("Graph cuts: what they mean, what to do",
                             "How to read and fix the graph-cut panels of this row.", GRAPH_CUT_TEXT, height=9))
            .with_panel(graph(
                "Graph cuts per training step by rank", "Graphs run before the step marker (cut off by .item(), "
                "print, an if on a tensor or a CPU fallback) per training step, per rank. The dashed line is the "
                "fragmentation alert threshold.",
                "suffix:cuts/step", (q.ratio("xla_graph_cuts_total", "xla_steps_total"), RANK_LEGEND),
                width=8, threshold=c.graph_cuts_per_step))
            .with_panel(graph(
                "Step markers per training step by rank", "Step markers that ran a graph per training step, per "
                "rank: 1 for one mark_step/sync per step, more with gradient accumulation or a marker after "
                "backward. Markers are not cuts.",
                "suffix:markers/step", (q.ratio("xla_step_markers_total", "xla_steps_total"), RANK_LEGEND),
                width=8))
            .with_panel(graph(
                "Graphs per step by rank", "Average number of XLA graphs run per training step, per rank: the "
                "graphs at step markers plus the graph cuts.",
                "suffix:graphs/step", (q.ratio("xla_graphs_per_step_sum", "xla_graphs_per_step_count"),
                                       RANK_LEGEND),
                width=8))
            .with_panel(graph(
                "Fragmented steps", "Share of training steps with at least one graph cut, per rank.",
                "percentunit", (q.ratio("xla_fragmented_steps_total", "xla_steps_total"), RANK_LEGEND),
                width=8))
            .with_panel(graph(
                "Host reads per step", "Device-to-host transfers per training step (all reads, CPU fallbacks "
                "included) and .item() calls per step, per rank.",
                "suffix:reads/step",
                (q.ratio("xla_device_to_host_transfers_total", "xla_steps_total"), "all reads, " + RANK_LEGEND),
                (q.ratio("xla_host_scalar_reads_total", "xla_steps_total"), ".item(), " + RANK_LEGEND),
                width=8, threshold=c.host_reads_per_step))
            .with_panel(graph(
                "Time reading from the device", "Share of the step wall time spent in device-to-host transfers "
                "(TransferFromDeviceTime), per rank.",
                "percentunit", (q.ratio("xla_transfer_from_device_seconds_total", "xla_step_duration_seconds_sum"),
                                RANK_LEGEND),
                width=8))
            .with_panel(graph(
                "Host-to-device transfers per step", "Uploads per training step, per rank: input batches, and the "
                "results of CPU-fallback operators going back to the device.",
                "suffix:transfers/step",
                (q.ratio("xla_host_to_device_transfers_total", "xla_steps_total"), RANK_LEGEND), width=24)))


def recompile_row(board: Dashboard, c: Config, q: Queries) -> Dashboard:
    return (board.with_row(Row("Recompilations"))
            .with_panel(note("Recompilations: what they mean, what to do",
                             "How to read and fix the recompilation panels of this row.", RECOMPILE_TEXT))
            .with_panel(graph(
                "Recompilations per step", "Compiler runs after warm-up per training step, per rank. The dashed "
                "line is the recompilation-storm alert threshold.",
                "suffix:compiles/step", (q.ratio("xla_recompilations_total", "xla_steps_total"), RANK_LEGEND),
                width=8, threshold=c.recompilations_per_step))
            .with_panel(graph(
                "Compile share of step time", "Share of the step wall time spent compiling, per rank. The dashed "
                "line is the compile-time alert threshold.",
                "percentunit", (q.ratio("xla_compile_seconds_total", "xla_step_duration_seconds_sum"),
                                RANK_LEGEND),
                width=8, threshold=c.compile_time_share))
            .with_panel(graph(
                "Mean time per compilation", "Compile time of one graph on average since the process started, "
                "per rank: what each recompilation costs.",
                "s", (f"sum by (run_id, rank) (xla_compile_seconds_total{{{q.rank}}})"
                      f" / sum by (run_id, rank) (xla_compilations_total{{{q.rank}}})", RANK_LEGEND), width=8))
            .with_panel(graph(
                "Compile cache", "Graphs served from the compile cache and graphs compiled, per second, per rank.",
                "suffix:graphs/s",
                (q.rate("xla_graph_cache_hits_total"), "cache hits, " + RANK_LEGEND),
                (q.rate("xla_compilations_total"), "compiled, " + RANK_LEGEND)))
            .with_panel(instant_table(
                "Recompilations by rank", "Compiler runs after warm-up in the selected time range, per run and "
                "rank.",
                "short", q.increase("xla_recompilations_total", "run_id, rank"),
                {"run_id": "Run", "rank": "Rank"}, "Recompilations in range")))


def build(c: Config = DEFAULTS) -> model.Dashboard:
    """The dashboard for configuration ``c`` (its selector, and the alert thresholds drawn on its panels)."""
    q = Queries(c)
    board = (Dashboard("neuron-exporter / Fragmentation & recompiles").uid(UID)
             .description("Why PyTorch/XLA steps run more than one graph or recompile: CPU-fallback operators, "
                          "host reads such as .item(), and changing graphs, by run, rank and operator.")
             .tags(["neuron-exporter", "pytorch-xla"]).time("now-1h", "now").refresh("30s")
             .tooltip(model.DashboardCursorSync.CROSSHAIR).links(dashboard_links()))
    board = variables(board, q, with_op=True)
    for row in (fallback_row, graph_cut_row, recompile_row):
        board = row(board, c, q)
    return finish(board)
