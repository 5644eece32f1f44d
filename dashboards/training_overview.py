"""The "Training overview" dashboard: is the job stepping, how fast, where does the step time go, and is the
exporter healthy."""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard, Row
from grafana_foundation_sdk.models import dashboard as model

from .config import DEFAULTS, Thresholds
from .panels import (RANK, TARGET, dashboard_links, finish, graph, instant_table, rate, ratio, single_stat,
                     variables)

UID = "neuron-exporter-training"


def percentile(q: float) -> str:
    return (f"histogram_quantile({q}, sum by (le) "
            f"(rate(xla_step_duration_seconds_bucket{{{RANK}}}[$__rate_interval])))")


def summary_row(board: Dashboard, t: Thresholds) -> Dashboard:
    return (board.with_row(Row("Summary"))
            .with_panel(single_stat(
                "Steps per second", "Training steps ended per second, averaged over the selected ranks.",
                "suffix:steps/s", f"avg({rate('xla_steps_total')})"))
            .with_panel(single_stat(
                "Graphs per step", "XLA graphs run per step over the selected ranks. 1 is ideal; more means "
                "something cuts the graph (.item(), print, .cpu(), a CPU-fallback operator).",
                "suffix:graphs/step", ratio("xla_graphs_per_step_sum", "xla_graphs_per_step_count", by=""),
                steps=((None, "green"), (1.05, "orange"), (t.graphs_per_step, "red"))))
            .with_panel(single_stat(
                "CPU-fallback calls", "Calls of operators without an XLA lowering (run on the CPU) in the "
                "selected time range, all ranks. Anything above 0 fragments the graph.",
                "short", f"sum(increase(xla_cpu_fallback_ops_total{{{RANK}}}[$__range])) or vector(0)",
                steps=((None, "green"), (1, "red"))))
            .with_panel(single_stat(
                "Recompilations after warm-up", "Compiler runs after the warm-up steps in the selected time "
                "range, all ranks. A stable training loop has 0.",
                "short", f"sum(increase(xla_recompilations_total{{{RANK}}}[$__range])) or vector(0)",
                steps=((None, "green"), (1, "orange"), (10, "red"))))
            .with_panel(single_stat(
                "Host reads per step", "Device-to-host transfers (.item(), print, .cpu(), CPU fallbacks) per "
                "step over the selected ranks. Each one makes the host wait for the device.",
                "suffix:reads/step", ratio("xla_device_to_host_transfers_total", "xla_steps_total", by=""),
                steps=((None, "green"), (t.host_reads_per_step, "red"))))
            .with_panel(single_stat(
                "Ranks not running", "Ranks the node endpoint reports as hung or dead.",
                "short", f'count(neuron_exporter_rank_state{{{RANK}, state!="running"}} == 1) or vector(0)',
                steps=((None, "green"), (1, "red")))))


def throughput_row(board: Dashboard, t: Thresholds) -> Dashboard:
    return (board.with_row(Row("Throughput and step time"))
            .with_panel(graph(
                "Steps per second by rank", "Training steps ended per second on each rank. A rank that falls "
                "behind the others slows every collective operation.",
                "suffix:steps/s", (rate("xla_steps_total"), "rank {{rank}}")))
            .with_panel(graph(
                "Step time percentiles", "Wall time from one step end to the next (xla_step_duration_seconds), "
                "over the selected ranks: median, 90th and 99th percentile, and mean.",
                "s", (percentile(0.5), "p50"), (percentile(0.9), "p90"), (percentile(0.99), "p99"),
                (ratio("xla_step_duration_seconds_sum", "xla_step_duration_seconds_count", by=""), "mean"))))


def compile_row(board: Dashboard, t: Thresholds) -> Dashboard:
    return (board.with_row(Row("Compile and execute"))
            .with_panel(graph(
                "Compile vs execute share of step time", "Share of each rank's step wall time spent compiling "
                "graphs (CompileTime) and executing them (ExecuteTime). Compilation should vanish after warm-up.",
                "percentunit",
                (ratio("xla_compile_seconds_total", "xla_step_duration_seconds_sum"), "compile, rank {{rank}}"),
                (ratio("xla_execute_seconds_total", "xla_step_duration_seconds_sum"), "execute, rank {{rank}}"),
                width=8))
            .with_panel(graph(
                "Graphs per step by rank", "Average number of XLA graphs run per step on each rank. The dashed "
                "line is the fragmentation alert threshold.",
                "suffix:graphs/step", (ratio("xla_graphs_per_step_sum", "xla_graphs_per_step_count"),
                                       "rank {{rank}}"),
                width=8, threshold=t.graphs_per_step))
            .with_panel(graph(
                "Compilations per minute", "Compiler runs per minute on each rank: all of them, and those after "
                "warm-up (recompilations), which mean the graph keeps changing.",
                "suffix:compiles/min",
                (f"60 * {rate('xla_recompilations_total')}", "after warm-up, rank {{rank}}"),
                (f"60 * {rate('xla_compilations_total')}", "all, rank {{rank}}"),
                width=8)))


def host_row(board: Dashboard, t: Thresholds) -> Dashboard:
    return (board.with_row(Row("Host reads and CPU fallback"))
            .with_panel(graph(
                "Host reads per step by rank", "Device-to-host transfers per step (every read of device data by "
                "the host, CPU fallbacks included) and .item() calls per step, on each rank.",
                "suffix:reads/step",
                (ratio("xla_device_to_host_transfers_total", "xla_steps_total"), "all reads, rank {{rank}}"),
                (ratio("xla_host_scalar_reads_total", "xla_steps_total"), ".item(), rank {{rank}}"),
                threshold=t.host_reads_per_step))
            .with_panel(instant_table(
                "Top CPU-fallback operators", "Operators without an XLA lowering, by calls per second over the "
                "selected time range, all selected ranks. Drill down in the Fragmentation & recompiles dashboard.",
                "suffix:calls/s",
                f"topk(10, sum by (op) (rate(xla_cpu_fallback_ops_total{{{RANK}}}[$__range])))",
                {"op": "Operator"}, "Calls per second")))


def health_row(board: Dashboard, t: Thresholds) -> Dashboard:
    ok = model.ValueMap(options={"0": model.ValueMappingResult(text="failing", color="red", index=0),
                                 "1": model.ValueMappingResult(text="ok", color="green", index=1)})
    return (board.with_row(Row("Exporter health"))
            .with_panel(single_stat(
                "Endpoints up", "Scrape targets of the selected job and instances that answered the last scrape.",
                "short", f"sum(up{{{TARGET}}})", width=4, height=8))
            .with_panel(single_stat(
                "Collector success", "Whether each collector of the exporter succeeded on its last run.",
                "none", f"min by (collector) (neuron_exporter_collector_success{{{TARGET}}})",
                steps=((None, "red"), (1, "green")), legend="{{collector}}", width=8, height=8, mappings=[ok]))
            .with_panel(graph(
                "Collection errors", "Errors inside the exporter's collection code per interval, by stage "
                "(step, scrape, spool). The training loop is never interrupted by them.",
                "short",
                (f"sum by (stage) (increase(neuron_exporter_collection_errors_total{{{TARGET}}}"
                 f"[$__rate_interval]))", "{{stage}}")))
            .with_panel(instant_table(
                "Rank state", "State of every rank the node endpoint knows (running, hung or dead) and the time "
                "since it last reported.",
                "s",
                f"(time() - max by (rank, local_rank) (neuron_exporter_rank_last_report_timestamp_seconds{{{RANK}}}))"
                f" * on (rank, local_rank) group_left (state)"
                f" (max by (rank, local_rank, state) (neuron_exporter_rank_state{{{RANK}}}) == 1)",
                {"rank": "Rank", "local_rank": "Local rank", "state": "State"}, "Since last report",
                width=24, height=6))
            .with_panel(graph(
                "Exporter share of step time", "Time the exporter spends in its step hook, as a share of each "
                "rank's step wall time: the monitoring overhead.",
                "percentunit", (ratio("neuron_exporter_step_hook_seconds_total", "xla_step_duration_seconds_sum"),
                                "rank {{rank}}"),
                width=12))
            .with_panel(graph(
                "Resident memory by rank", "Resident set size of each training process.",
                "bytes", (f"sum by (rank) (xla_process_resident_memory_bytes{{{RANK}}})", "rank {{rank}}"),
                width=12)))


def build(t: Thresholds = DEFAULTS) -> model.Dashboard:
    """The dashboard; ``t`` gives the alert thresholds drawn on its panels."""
    board = (Dashboard("neuron-exporter / Training overview").uid(UID)
             .description("PyTorch/XLA training seen through neuron-exporter: throughput, step time, compile vs "
                          "execute, graph fragmentation, host reads, CPU-fallback operators and exporter health.")
             .tags(["neuron-exporter", "pytorch-xla"]).time("now-1h", "now").refresh("30s")
             .tooltip(model.DashboardCursorSync.CROSSHAIR).links(dashboard_links()))
    board = variables(board)
    for row in (summary_row, throughput_row, compile_row, host_row, health_row):
        board = row(board, t)
    return finish(board)
