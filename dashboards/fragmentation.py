"""The "Fragmentation & recompiles" dashboard: one row per problem, each opening with what it means and what to
do, then the evidence by rank and operator."""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard, Row
from grafana_foundation_sdk.models import dashboard as model

from .config import DEFAULTS, Thresholds
from .panels import RANK, dashboard_links, finish, graph, instant_table, note, rate, ratio, variables

UID = "neuron-exporter-fragmentation"

OP = RANK + ', op=~"$op"'

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
**What it means.** A step should run one graph. Reading device data on the host (`.item()`, `print(tensor)`,
`.cpu()`, `.tolist()`, an `if` on a tensor value) executes the graph built so far and waits for its result, so
the step runs two or more graphs and the host stalls on the device. CPU-fallback operators (row above) cut the
graph the same way.

**What to do.** Read values after `torch_xla.sync()` / `xm.mark_step()` instead of before it, log every N steps
rather than every step, or pass the tensors to `xm.add_step_closure()` so they are read once the step's graph
has run. Keep data-dependent Python branches out of the step.
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


def fallback_row(board: Dashboard, t: Thresholds) -> Dashboard:
    return (board.with_row(Row("CPU-fallback operators"))
            .with_panel(note("CPU-fallback operators: what they mean, what to do",
                             "How to read and fix the CPU-fallback operator panels of this row.", FALLBACK_TEXT))
            .with_panel(instant_table(
                "Fallback calls by rank and operator", "Calls of each operator without an XLA lowering in the "
                "selected time range, per rank.",
                "short", f"sum by (rank, op) (increase(xla_cpu_fallback_ops_total{{{OP}}}[$__range]))",
                {"rank": "Rank", "op": "Operator"}, "Calls in range"))
            .with_panel(graph(
                "Fallback calls per step", "Calls of each CPU-fallback operator per training step, per rank. "
                "1 means the operator runs once in every step.",
                "suffix:calls/step",
                (f"sum by (rank, op) (rate(xla_cpu_fallback_ops_total{{{OP}}}[$__rate_interval]))"
                 f" / on (rank) group_left {rate('xla_steps_total')}", "{{op}}, rank {{rank}}")))
            .with_panel(graph(
                "Fallback calls per second", "Calls per second of each CPU-fallback operator, per rank.",
                "suffix:calls/s",
                (rate("xla_cpu_fallback_ops_total", by="rank, op", matchers=OP), "{{op}}, rank {{rank}}"),
                width=24)))


def graph_cut_row(board: Dashboard, t: Thresholds) -> Dashboard:
    return (board.with_row(Row("Graph cuts: .item(), print and host reads"))
            .with_panel(note("Graph cuts: what they mean, what to do",
                             "How to read and fix the graph-cut panels of this row.", GRAPH_CUT_TEXT))
            .with_panel(graph(
                "Graphs per step by rank", "Average number of XLA graphs run per step. The dashed line is the "
                "fragmentation alert threshold.",
                "suffix:graphs/step", (ratio("xla_graphs_per_step_sum", "xla_graphs_per_step_count"),
                                       "rank {{rank}}"),
                width=8, threshold=t.graphs_per_step))
            .with_panel(graph(
                "Fragmented steps", "Share of steps that ran more than one graph, per rank.",
                "percentunit", (ratio("xla_fragmented_steps_total", "xla_steps_total"), "rank {{rank}}"),
                width=8))
            .with_panel(graph(
                "Host reads per step", "Device-to-host transfers per step (all reads, CPU fallbacks included) "
                "and .item() calls per step, per rank.",
                "suffix:reads/step",
                (ratio("xla_device_to_host_transfers_total", "xla_steps_total"), "all reads, rank {{rank}}"),
                (ratio("xla_host_scalar_reads_total", "xla_steps_total"), ".item(), rank {{rank}}"),
                width=8, threshold=t.host_reads_per_step))
            .with_panel(graph(
                "Time reading from the device", "Share of the step wall time spent in device-to-host transfers "
                "(TransferFromDeviceTime), per rank.",
                "percentunit", (ratio("xla_transfer_from_device_seconds_total", "xla_step_duration_seconds_sum"),
                                "rank {{rank}}")))
            .with_panel(graph(
                "Host-to-device transfers per step", "Uploads per step, per rank: input batches, and the results "
                "of CPU-fallback operators going back to the device.",
                "suffix:transfers/step",
                (ratio("xla_host_to_device_transfers_total", "xla_steps_total"), "rank {{rank}}"))))


def recompile_row(board: Dashboard, t: Thresholds) -> Dashboard:
    return (board.with_row(Row("Recompilations"))
            .with_panel(note("Recompilations: what they mean, what to do",
                             "How to read and fix the recompilation panels of this row.", RECOMPILE_TEXT))
            .with_panel(graph(
                "Recompilations per step", "Compiler runs after warm-up per step, per rank. The dashed line is "
                "the recompilation-storm alert threshold.",
                "suffix:compiles/step", (ratio("xla_recompilations_total", "xla_steps_total"), "rank {{rank}}"),
                width=8, threshold=t.recompilations_per_step))
            .with_panel(graph(
                "Compile share of step time", "Share of the step wall time spent compiling, per rank. The dashed "
                "line is the compile-time alert threshold.",
                "percentunit", (ratio("xla_compile_seconds_total", "xla_step_duration_seconds_sum"),
                                "rank {{rank}}"),
                width=8, threshold=t.compile_time_share))
            .with_panel(graph(
                "Mean time per compilation", "Compile time of one graph on average since the process started, "
                "per rank: what each recompilation costs.",
                "s", (f"sum by (rank) (xla_compile_seconds_total{{{RANK}}})"
                      f" / sum by (rank) (xla_compilations_total{{{RANK}}})", "rank {{rank}}"), width=8))
            .with_panel(graph(
                "Compile cache", "Graphs served from the compile cache and graphs compiled, per second, per rank.",
                "suffix:graphs/s",
                (rate("xla_graph_cache_hits_total"), "cache hits, rank {{rank}}"),
                (rate("xla_compilations_total"), "compiled, rank {{rank}}")))
            .with_panel(instant_table(
                "Recompilations by rank", "Compiler runs after warm-up in the selected time range, per rank.",
                "short", f"sum by (rank) (increase(xla_recompilations_total{{{RANK}}}[$__range]))",
                {"rank": "Rank"}, "Recompilations in range")))


def build(t: Thresholds = DEFAULTS) -> model.Dashboard:
    """The dashboard; ``t`` gives the alert thresholds drawn on its panels."""
    board = (Dashboard("neuron-exporter / Fragmentation & recompiles").uid(UID)
             .description("Why PyTorch/XLA steps run more than one graph or recompile: CPU-fallback operators, "
                          "host reads such as .item(), and changing graphs, by rank and operator.")
             .tags(["neuron-exporter", "pytorch-xla"]).time("now-1h", "now").refresh("30s")
             .tooltip(model.DashboardCursorSync.CROSSHAIR).links(dashboard_links()))
    board = variables(board, with_op=True)
    for row in (fallback_row, graph_cut_row, recompile_row):
        board = row(board, t)
    return finish(board)
