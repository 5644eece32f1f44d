"""The "Training overview" dashboard: is each run stepping, how fast, which lines cut or recompile its graphs,
where does the step time go, and is the exporter healthy."""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard, Row
from grafana_foundation_sdk.models import dashboard as model

from ...catalogue import (
    COLLECTION_ERRORS,
    COLLECTOR_SUCCESS,
    PROCESS_MEMORY,
    RANK_LAST_REPORT,
    RANK_STATE,
    SPOOL_DIRECTORY_OK,
    SPOOL_REJECTED,
    STEP_HOOK_SECONDS,
    TRAINING_TIME,
    XLA_COMPILATIONS,
    XLA_COMPILE_SECONDS,
    XLA_DEVICE_TO_HOST,
    XLA_EXECUTE_SECONDS,
    XLA_FALLBACK_OPS,
    XLA_GRAPH_CUTS,
    XLA_GRAPHS_PER_STEP,
    XLA_HOST_SCALAR_READS,
    XLA_NEW_GRAPHS,
    XLA_RECOMPILATIONS,
    XLA_STEP_DURATION,
    XLA_STEP_MARKERS,
    XLA_STEPS,
)
from ..config import DEFAULTS, Config
from .panels import (
    BY_RUN,
    RANK_LEGEND,
    RUN_LEGEND,
    Queries,
    dashboard_links,
    finish,
    graph,
    instant_table,
    merged_table,
    single_stat,
    variables,
)

UID = "neuron-exporter-training"


def percentile(q: Queries, quantile: float) -> str:
    return (
        f"histogram_quantile({quantile}, sum by (le) "
        f"(rate({XLA_STEP_DURATION.name}_bucket{{{q.rank}}}[$__rate_interval])))"
    )


def summary_row(board: Dashboard, c: Config, q: Queries) -> Dashboard:
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


PHASE_COLUMNS = {"data": "Data", "compile": "Compile", "host_sync": "Host sync", "checkpoint": "Checkpoint",
                 "startup": "Startup", "other": "Other"}  # fmt: skip


def time_share(q: Queries, by: str, phase: str, window: str = "$__rate_interval") -> str:
    """The share of the training thread's time spent in ``phase`` (a matcher: ``phase="step"``), by ``by``."""
    return (
        f"{q.rate(TRAINING_TIME.name, by=by, matchers=f'{q.rank}, {phase}', window=window)}"
        f" / on ({by}) group_left () ({q.rate(TRAINING_TIME.name, by=by, window=window)} > 0)"
    )


def goodput_row(board: Dashboard, c: Config, q: Queries) -> Dashboard:
    by_rank = "run_id, instance, rank"
    board = (
        board.with_row(Row("Goodput: where the time goes"))
        .with_panel(
            graph(
                "Goodput by run",
                "The share of each run's training-thread time spent in training steps, over its selected ranks "
                "(the training time by phase, every backend). The rest is badput, by phase on the right. The "
                "dashed line is the TrainingGoodputLow threshold.",
                "percentunit",
                (time_share(q, BY_RUN, 'phase="step"'), RUN_LEGEND),
                threshold=c.goodput_min,
            )
        )
        .with_panel(
            graph(
                "Badput by phase",
                "Where the rest of the selected ranks' training-thread time goes: startup (before the first "
                "optimizer), data (waiting for the next batch), compile, host_sync (waiting for device data), "
                "checkpoint, other (after the last step). Stacked: with goodput, they add up to 1.",
                "percentunit",
                (time_share(q, "phase", 'phase!="step"'), "{{phase}}"),
                stacked=True,
            )
        )
    )
    columns = [(time_share(q, by_rank, 'phase!="step"', "$__range"), "Badput", None)]
    columns += [
        (time_share(q, by_rank, f'phase="{phase}"', "$__range"), header, None)
        for phase, header in PHASE_COLUMNS.items()
    ]
    return board.with_panel(
        merged_table(
            "Goodput by rank",
            "Each selected rank's badput over the time range, and its share of each phase: the rank at the top "
            "loses the most. A rank whose data share stands out is the one whose input pipeline makes the others "
            "wait; one whose compile or host_sync share stands out compiles or reads the device more than the "
            "others (neuron-exporter diagnose URL names the lines).",
            "percentunit",
            {"run_id": "Run", "instance": "Instance", "rank": "Rank"},
            *columns,
            width=24,
            height=8,
        )
    )


def runs_row(board: Dashboard, c: Config, q: Queries) -> Dashboard:
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


def where_row(board: Dashboard, c: Config, q: Queries) -> Dashboard:
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


def throughput_row(board: Dashboard, c: Config, q: Queries) -> Dashboard:
    return (
        board.with_row(Row("Throughput and step time"))
        .with_panel(
            graph(
                "Steps per second by rank",
                "Training steps ended per second on each rank. A rank that falls "
                "behind the others slows every collective operation.",
                "suffix:steps/s",
                (q.rate(XLA_STEPS.name), RANK_LEGEND),
            )
        )
        .with_panel(
            graph(
                "Step time percentiles",
                "Wall time from one training step end to the next "
                "(xla_step_duration_seconds), over the selected ranks: median, 90th and 99th percentile, and mean.",
                "s",
                (percentile(q, 0.5), "p50"),
                (percentile(q, 0.9), "p90"),
                (percentile(q, 0.99), "p99"),
                (q.ratio(f"{XLA_STEP_DURATION.name}_sum", f"{XLA_STEP_DURATION.name}_count", by=""), "mean"),
            )
        )
    )


def compile_row(board: Dashboard, c: Config, q: Queries) -> Dashboard:
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


def host_row(board: Dashboard, c: Config, q: Queries) -> Dashboard:
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


def health_row(board: Dashboard, c: Config, q: Queries) -> Dashboard:
    ok = model.ValueMap(
        options={
            "0": model.ValueMappingResult(text="failing", color="red", index=0),
            "1": model.ValueMappingResult(text="ok", color="green", index=1),
        }
    )
    return (
        board.with_row(Row("Exporter health"))
        .with_panel(
            single_stat(
                "Endpoints up",
                "Scrape targets of the selected job and instances that answered the last scrape.",
                "short",
                f"sum(up{{{q.target}}})",
                width=4,
                height=8,
            )
        )
        .with_panel(
            single_stat(
                "Collector success",
                "Whether each collector of the exporter succeeded on its last run.",
                "none",
                f"min by (collector) ({COLLECTOR_SUCCESS.name}{{{q.target}}})",
                steps=((None, "red"), (1, "green")),
                legend="{{collector}}",
                width=8,
                height=8,
                mappings=[ok],
            )
        )
        .with_panel(
            graph(
                "Collection errors",
                "Errors inside the exporter's collection code per interval, by stage "
                "(step, scrape, spool). The training loop is never interrupted by them.",
                "short",
                (
                    f"sum by (stage) (increase({COLLECTION_ERRORS.name}{{{q.target}}}[$__rate_interval]))",
                    "{{stage}}",
                ),
            )
        )
        .with_panel(
            instant_table(
                "Rank state",
                "State of every rank the node endpoint knows (running, hung or dead), its run, and "
                "the time since it last reported.",
                "s",
                f"(time() - max by (run_id, rank, local_rank) "
                f"({RANK_LAST_REPORT.name}{{{q.rank}}}))"
                f" * on (run_id, rank, local_rank) group_left (state)"
                f" (max by (run_id, rank, local_rank, state) ({RANK_STATE.name}{{{q.rank}}}) == 1)",
                {"run_id": "Run", "rank": "Rank", "local_rank": "Local rank", "state": "State"},
                "Since last report",
                width=24,
                height=6,
            )
        )
        .with_panel(
            graph(
                "Exporter share of step time",
                "Time the exporter spends in its step hook, as a share of each "
                "rank's step wall time: the monitoring overhead.",
                "percentunit",
                (q.ratio(STEP_HOOK_SECONDS.name, f"{XLA_STEP_DURATION.name}_sum"), RANK_LEGEND),
                width=8,
            )
        )
        .with_panel(
            graph(
                "Resident memory by rank",
                "Resident set size of each training process.",
                "bytes",
                (f"sum by (run_id, rank) ({PROCESS_MEMORY.name}{{{q.rank}}})", RANK_LEGEND),
                width=8,
            )
        )
        .with_panel(
            graph(
                "Spool problems",
                "Rank files in the spool directory that the node endpoint refuses, by reason "
                "(see its log), and node endpoints that cannot read their spool directory (1). Both should be 0.",
                "short",
                (
                    f"max by (instance, reason) ({SPOOL_REJECTED.name}{{{q.target}}})",
                    "rejected files: {{reason}}, {{instance}}",
                ),
                (
                    f"max by (instance) (1 - {SPOOL_DIRECTORY_OK.name}{{{q.target}}})",
                    "directory not read, {{instance}}",
                ),
                width=8,
            )
        )
    )


def build(c: Config = DEFAULTS) -> model.Dashboard:
    """The dashboard for configuration ``c`` (its selector, and the alert thresholds drawn on its panels)."""
    q = Queries(c)
    board = (
        Dashboard("neuron-exporter / Training overview")
        .uid(UID)
        .description(
            "PyTorch/XLA training seen through neuron-exporter, per run: goodput and where the rest of the time goes, "
            "throughput, step time, "
            "graph cuts and recompilations with their top sites, compile vs execute, host reads, "
            "CPU-fallback operators and exporter health."
        )
        .tags(["neuron-exporter", "pytorch-xla"])
        .time("now-1h", "now")
        .refresh("30s")
        .tooltip(model.DashboardCursorSync.CROSSHAIR)
        .links(dashboard_links())
    )
    board = variables(board, q)
    for row in (summary_row, goodput_row, runs_row, where_row, throughput_row, compile_row, host_row, health_row):
        board = row(board, c, q)
    return finish(board)
