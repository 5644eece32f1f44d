"""The "Throughput and step time" row: each run's tokens, samples and FLOPs per second, its peak and MFU, the same by
rank, then steps per second by rank and the step time's percentiles. MFU is what the recording rules call it
(rules/throughput.py): the FLOP/s of a run's live ranks over their peaks, where every one that counts FLOPs serves a
peak; above 1 the peak is wrong, and the panels say so in words."""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard, Row
from grafana_foundation_sdk.models import dashboard as model

from ....catalogue import (
    PROCESS_CPU,
    TRAINING_FLOPS,
    TRAINING_PEAK_FLOPS,
    TRAINING_SAMPLES,
    TRAINING_TOKENS,
    XLA_STEP_DURATION,
    XLA_STEPS,
)
from ...config import Config
from ..panels import RANK_LEGEND, RUN_LEGEND, Queries, graph, merged_table, single_stat

BY_RUN = "job, run_id"
BY_RANK = "job, run_id, instance, rank"
TOKENS_UNIT = "count:tokens/s"
SAMPLES_UNIT = "count:samples/s"
FLOPS_UNIT = "flops"
# MFU above 1 is a peak that is too low (the peak_flops option, or a rank on more NeuronCores than it is told of).
PEAK_TOO_LOW = model.RangeMap(
    options=model.DashboardRangeMapOptions(
        from_val=1.0,
        to=1e300,  # older Grafana releases read a null bound as 0, not as infinity
        result=model.ValueMappingResult(text="peak too low: set peak_flops", color="red", index=0),
    )
)


def percentile(q: Queries, quantile: float) -> str:
    return (
        f"histogram_quantile({quantile}, sum by (le) "
        f"(rate({XLA_STEP_DURATION.name}_bucket{{{q.rank}}}[$__rate_interval])))"
    )


def live(q: Queries, window: str) -> str:
    """The selected ranks whose process used CPU time within ``window``."""
    return f"({q.rate(PROCESS_CPU.name, by=BY_RANK, window=window)} > 0)"


def peak(q: Queries) -> str:
    return f"max by ({BY_RANK}) ({TRAINING_PEAK_FLOPS.name}{{{q.rank}}})"


def run_peak(q: Queries, window: str = "$__rate_interval") -> str:
    """Each run's peak FLOP/s: its live ranks' peaks, as ``run:training_peak_flops:sum`` takes it."""
    return f"sum by ({BY_RUN}) ({peak(q)} and on ({BY_RANK}) {live(q, window)})"


def run_mfu(q: Queries, window: str = "$__rate_interval") -> str:
    """Each run's MFU, as ``run:training_mfu:ratio5m`` takes it: its live ranks' FLOP/s over their peaks, where one of
    them counts FLOPs and every one that does serves a peak."""
    flops = q.rate(TRAINING_FLOPS.name, by=BY_RANK, window=window)
    counting = f"max by ({BY_RANK}) ({TRAINING_FLOPS.name}{{{q.rank}}}) > 0 and on ({BY_RANK}) {live(q, window)}"
    return (
        f"sum by ({BY_RUN}) ({flops} and on ({BY_RANK}) {live(q, window)})"
        f" / on ({BY_RUN}) ({run_peak(q, window)} > 0)"
        f" and on ({BY_RUN}) ({counting})"
        f" unless on ({BY_RUN}) ({counting} unless on ({BY_RANK}) {peak(q)})"
    )


def row(board: Dashboard, c: Config, q: Queries) -> Dashboard:
    def per_run(counter: str) -> str:
        return q.rate(counter, by=BY_RUN)

    def per_rank(counter: str) -> str:
        return q.rate(counter, by=BY_RANK, window="$__range")

    table = merged_table(
        "Throughput by rank",
        "Each selected rank's tokens, samples and FLOPs per second over the time range, its peak FLOP/s "
        f"({TRAINING_PEAK_FLOPS.name}) and its MFU, its FLOP/s over its peak: the ranks of a data-parallel run "
        "should show the same. A rank below the others is slower (its steps per second, below) or gets less work "
        "(shorter sequences, a smaller shard). Peak and MFU are empty where the peak is unknown (the CPU, a GPU: "
        "set the peak_flops option); MFU above 1 reads as a peak that is too low.",
        TOKENS_UNIT,
        {"run_id": "Run", "instance": "Instance", "rank": "Rank"},
        (per_rank(TRAINING_TOKENS.name), "Tokens/s", None),
        (per_rank(TRAINING_SAMPLES.name), "Samples/s", SAMPLES_UNIT),
        (per_rank(TRAINING_FLOPS.name), "FLOP/s", FLOPS_UNIT),
        (peak(q), "Peak", FLOPS_UNIT),
        (f"{per_rank(TRAINING_FLOPS.name)} / on ({BY_RANK}) ({peak(q)} > 0)", "MFU", None),
        width=18,
        height=8,
    ).override_by_name(
        "MFU",
        [
            model.DynamicConfigValue(id_val="unit", value="percentunit"),
            model.DynamicConfigValue(id_val="mappings", value=[PEAK_TOO_LOW]),
        ],
    )
    return (
        board.with_row(Row("Throughput and step time"))
        .with_panel(
            graph(
                "Tokens per second by run",
                "Tokens each run's selected ranks took from their input pipelines per second, summed over them: the "
                "elements of each batch's token ids (input_ids, else its first tensor when it holds integer ids), "
                "padding included. A run whose batches hold no token ids (images) shows 0: its samples are on the "
                "right. With tensor or pipeline parallelism several ranks load the same batch: divide by the "
                "model-parallel size.",
                TOKENS_UNIT,
                (per_run(TRAINING_TOKENS.name), RUN_LEGEND),
                width=8,
            )
        )
        .with_panel(
            graph(
                "Samples per second by run",
                "Samples (each batch's leading dimension) each run's selected ranks took from their input pipelines "
                "per second, summed over them; TrainingThroughputDropped judges a run without tokens by these.",
                SAMPLES_UNIT,
                (per_run(TRAINING_SAMPLES.name), RUN_LEGEND),
                width=8,
            )
        )
        .with_panel(
            graph(
                "FLOP/s by run",
                "Floating-point operations of each run's training steps per second, forward and backward, summed "
                "over its selected ranks (counted from the compiled graphs, or from the first batch of each shape), "
                "and the run's peak: the peak FLOP/s of its live ranks' devices, where they serve one.",
                FLOPS_UNIT,
                (per_run(TRAINING_FLOPS.name), RUN_LEGEND),
                (run_peak(q), "peak {{job}} {{run_id}}"),
                width=8,
            )
        )
        .with_panel(
            single_stat(
                "MFU by run",
                "Model FLOPs utilization: each run's FLOP/s over the peak of its live ranks' devices, now. Empty where "
                "a rank that counts FLOPs has no peak (the CPU, a GPU: set the peak_flops option) or where no rank "
                "counts FLOPs. Above 100% the peak is wrong, and the panel says so (TrainingPeakFlopsTooLow).",
                "percentunit",
                run_mfu(q),
                steps=((None, "blue"),),
                legend=RUN_LEGEND,
                width=6,
                height=8,
                mappings=[PEAK_TOO_LOW],
            )
        )
        .with_panel(table)
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
