"""The "TorchNeuron" dashboard: a job on TorchNeuron's native ``neuron`` device (no torch_xla): its training steps,
the operators it runs on the CPU and where, host reads by line, its compile cache and compiled graphs, and device
memory, per run and rank."""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard, Row
from grafana_foundation_sdk.models import dashboard as model

from ...catalogue import (
    NEURON_CACHE_HITS,
    NEURON_CACHE_MISSES,
    NEURON_COMPILATIONS,
    NEURON_COMPILE_SECONDS,
    NEURON_COMPILED_GRAPHS,
    NEURON_FALLBACK_CALLS,
    NEURON_FALLBACK_OPS_SEEN,
    NEURON_FALLBACK_SITES,
    NEURON_GRAPH_FALLBACKS,
    NEURON_GRAPHS_WITH_COLLECTIVES,
    NEURON_HOST_READS,
    NEURON_MEMORY_ACTIVE_PEAK,
    NEURON_MEMORY_ALLOCATED,
    NEURON_MEMORY_OOMS,
    NEURON_MEMORY_RETRIES,
    TRAINING_STEPS,
)
from ..config import DEFAULTS, Config
from .panels import RANK_LEGEND, Queries, dashboard_links, finish, graph, merged_table, note, single_stat, variables
from .training_overview import device

UID = "neuron-exporter-torchneuron"
STEPS = TRAINING_STEPS.name

OP_COLUMNS = {"run_id": "Run", "op": "Operator"}
CALL_COLUMNS = {"run_id": "Run", "op": "Operator", "location": "Site", "pass": "Pass"}
CAUSE_SITE_COLUMNS = {"run_id": "Run", "cause": "Cause", "location": "Site"}
REASON_COLUMNS = {"run_id": "Run", "reason": "Reason"}

FALLBACK_TEXT = """
**What it means.** TorchNeuron runs an operator on the CPU when it has no Neuron kernel for it, when its Python
implementation cannot take a call, or when the call failed on the device. The device waits, and the tensors go to
the host and back, at every call. Operators TorchNeuron registers from Python are *counted per call*, with the line
that called them (a call from the backward pass: the line that called `backward()`); the others are only *seen*, in
TorchNeuron's set of their names, without counts (an operator with no kernel appears as its `.out` overload:
`aten::lgamma.out` is `torch.lgamma`).

**What to do.** Replace the operator with supported ones or move it out of the step (data preparation on the CPU).
`TORCH_NEURONX_FALLBACK_ONLY_FOR_UNIMPLEMENTED_OPS=1` makes the operators counted per call fail, naming the call.
Host reads (`.item()`, `print`, `if t:`) wait for the device too: read every N steps, or keep values on the device.
"""


def per_step(q: Queries, metric: str) -> str:
    return f"{q.rate(metric)} / ({q.rate(STEPS)} > 0)"


def summary_row(board: Dashboard, c: Config, q: Queries) -> Dashboard:
    def in_range(metric: str) -> str:
        return f"sum(increase({metric}{{{q.rank}}}[$__range])) or vector(0)"

    return (
        board.with_row(Row("TorchNeuron summary"))
        .with_panel(
            single_stat(
                "Training steps per second",
                "Training steps (rounds of torch.optim optimizer steps) per second, averaged over the selected ranks.",
                "suffix:steps/s",
                f"avg({q.rate(STEPS, by='run_id, instance, rank')})",
                width=6,
            )
        )
        .with_panel(
            single_stat(
                "CPU-fallback calls in range",
                "Calls of operators TorchNeuron ran on the CPU and counts per call, in the selected time range, all "
                "selected ranks.",
                "short",
                in_range(NEURON_FALLBACK_CALLS.name),
                steps=((None, "green"), (1, "red")),
                width=6,
            )
        )
        .with_panel(
            single_stat(
                "Operators seen on the CPU",
                "Operators in TorchNeuron's set of those it ran on the CPU, over the selected ranks (no counts).",
                "short",
                f"count(count by (op) ({NEURON_FALLBACK_OPS_SEEN.name}{{{q.rank}}})) or vector(0)",
                steps=((None, "green"), (1, "orange")),
                width=6,
            )
        )
        .with_panel(
            single_stat(
                "Host reads per step",
                "Reads of neuron tensors by the host per training step, over the selected ranks; red at the "
                "host-read alert threshold.",
                "suffix:reads/step",
                f"{q.rate(NEURON_HOST_READS.name, by='')} / ({q.rate(STEPS, by='')} > 0)",
                steps=((None, "green"), (c.host_reads_per_step, "red")),
                width=6,
            )
        )
    )


def fallback_row(board: Dashboard, c: Config, q: Queries) -> Dashboard:
    return (
        board.with_row(Row("CPU-fallback operators and host reads"))
        .with_panel(
            note(
                "TorchNeuron: what it means, what to do",
                "How to read and fix the CPU-fallback and host-read panels.",
                FALLBACK_TEXT,
                height=9,
            )
        )
        .with_panel(
            merged_table(
                "CPU-fallback operators",
                "Operators TorchNeuron ran on the CPU, per run: calls per training step in the selected time range "
                "(operators it counts per call), and on how many ranks it was counted or seen. other when the "
                "exporter's label budget is full.",
                "suffix:calls/step",
                OP_COLUMNS,
                (q.per_run_step(NEURON_FALLBACK_CALLS.name, "op", steps=STEPS), "Calls per step", None),
                (
                    f"count by (run_id, op) (max by (run_id, rank, op) ({NEURON_FALLBACK_OPS_SEEN.name}{{{q.rank}}}))",
                    "Ranks (seen)",
                    "short",
                ),
            )
        )
        .with_panel(
            merged_table(
                "Where fallback operators are called",
                "The lines that call each operator counted per call, per run (pass: forward, or backward for a "
                "call from the backward pass, named by the line that called backward()), and on how many ranks.",
                "short",
                CALL_COLUMNS,
                (
                    f"count by (run_id, op, location, pass) "
                    f"(max by (run_id, rank, op, location, pass) ({NEURON_FALLBACK_SITES.name}{{{q.rank}}}))",
                    "Ranks",
                    None,
                ),
            )
        )
        .with_panel(
            merged_table(
                "Host reads by site",
                "Reads of neuron tensors by the host from Python, per run, cause and line: reads per training step "
                "in the selected time range (over the run's selected ranks) and how many ranks read there.",
                "suffix:reads/step",
                CAUSE_SITE_COLUMNS,
                (
                    q.per_run_step(NEURON_HOST_READS.name, "cause, location", steps=STEPS),
                    "Reads per step",
                    None,
                ),
                (q.ranks_with(NEURON_HOST_READS.name, "cause, location"), "Ranks", "short"),
            )
        )
        .with_panel(
            graph(
                "CPU-fallback calls and host reads per step by rank",
                "Per training step on each rank: calls of operators TorchNeuron ran on the CPU (counted per call), "
                "and host reads of neuron tensors. The dashed line is the host-read alert threshold.",
                "short",
                (per_step(q, NEURON_FALLBACK_CALLS.name), "fallback calls " + RANK_LEGEND),
                (per_step(q, NEURON_HOST_READS.name), "host reads " + RANK_LEGEND),
                threshold=c.host_reads_per_step,
            )
        )
    )


def compile_row(board: Dashboard, c: Config, q: Queries) -> Dashboard:
    hits = f"sum by (run_id, rank) (rate({NEURON_CACHE_HITS.name}{{{q.rank}}}[$__rate_interval]))"
    misses = f"sum by (run_id, rank) (rate({NEURON_CACHE_MISSES.name}{{{q.rank}}}[$__rate_interval]))"
    return (
        board.with_row(Row("Compilation"))
        .with_panel(
            graph(
                "Compile cache hit ratio by rank",
                "Share of NEFF lookups found in TorchNeuron's compile cache (in memory or persistent) on each rank; "
                "a miss is compiled by neuronx-cc. Eager operators and compiled graphs share the cache.",
                "percentunit",
                (f"{hits} / ({hits} + {misses} > 0)", RANK_LEGEND),
                width=8,
            )
        )
        .with_panel(
            graph(
                "Compilations per step by rank",
                "neuronx-cc compilations per training step on each rank: of torch.compile graphs, or of eager "
                "operators' kernels. After warm-up both should be 0.",
                "short",
                (
                    f"sum by (run_id, rank, kind) (rate({NEURON_COMPILATIONS.name}{{{q.rank}}}[$__rate_interval]))"
                    f" / on (run_id, rank) group_left () ({q.rate(STEPS)} > 0)",
                    "{{kind}} rank {{rank}} ({{run_id}})",
                ),
                width=8,
            )
        )
        .with_panel(
            graph(
                "Compile time per step by rank",
                "Seconds neuronx-cc spent compiling per training step on each rank.",
                "s",
                (per_step(q, NEURON_COMPILE_SECONDS.name), RANK_LEGEND),
                width=8,
            )
        )
        .with_panel(
            graph(
                "Compiled graphs by rank",
                "Graphs the neuron backend of torch.compile compiled per second on each rank (forward and backward, "
                "from its cache or not), and those with collectives.",
                "short",
                (q.rate(NEURON_COMPILED_GRAPHS.name), "graphs " + RANK_LEGEND),
                (q.rate(NEURON_GRAPHS_WITH_COLLECTIVES.name), "with collectives " + RANK_LEGEND),
            )
        )
        .with_panel(
            merged_table(
                "Compiled graphs that fell back to eager",
                "Compiled graphs that failed to run and ran eagerly instead in the selected time range, per run and "
                "the failure TorchNeuron logged, and on how many ranks.",
                "short",
                REASON_COLUMNS,
                (f"{q.increase(NEURON_GRAPH_FALLBACKS.name, 'run_id, reason')} > 0", "In range", None),
                (q.ranks_with(NEURON_GRAPH_FALLBACKS.name, "reason"), "Ranks", None),
            )
        )
    )


def memory_row(board: Dashboard, c: Config, q: Queries) -> Dashboard:
    def by_rank(metric: str) -> str:
        return f"sum by (run_id, rank) ({metric}{{{q.rank}}})"

    return (
        board.with_row(Row("Device memory"))
        .with_panel(
            graph(
                "Device memory by rank",
                "Neuron device memory allocated by tensors now, and the peak in active use, on each rank.",
                "bytes",
                (by_rank(NEURON_MEMORY_ALLOCATED.name), "allocated " + RANK_LEGEND),
                (by_rank(NEURON_MEMORY_ACTIVE_PEAK.name), "active peak " + RANK_LEGEND),
            )
        )
        .with_panel(
            graph(
                "Allocation failures and retries by rank",
                "Device allocations that failed for want of memory (OOMs) and those that succeeded only after "
                "freeing cached memory, per minute on each rank.",
                "short",
                (q.rate(NEURON_MEMORY_OOMS.name) + " * 60", "OOMs " + RANK_LEGEND),
                (q.rate(NEURON_MEMORY_RETRIES.name) + " * 60", "retries " + RANK_LEGEND),
            )
        )
    )


def build(c: Config = DEFAULTS) -> model.Dashboard:
    """The dashboard for configuration ``c`` (its selector)."""
    q = Queries(c)
    board = (
        Dashboard("neuron-exporter / TorchNeuron")
        .uid(UID)
        .description(
            "A job on TorchNeuron's neuron device: CPU-fallback operators and where they are called, host reads by "
            "line, the compile cache and compiled graphs, device memory, each rank's NeuronCores in neuron-monitor, "
            "per run and rank."
        )
        .tags(["neuron-exporter", "torchneuron"])
        .time("now-1h", "now")
        .refresh("30s")
        .tooltip(model.DashboardCursorSync.CROSSHAIR)
        .links(dashboard_links())
    )
    board = variables(board, q, with_device=True)
    for row in (summary_row, fallback_row, compile_row, memory_row, device.row):
        board = row(board, c, q)
    return finish(board)
