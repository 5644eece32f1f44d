"""The "Run health" row, the run's own account beyond its ranks' goodput now: each run's goodput over its whole life,
what its restarts cost (restarts, recovery, work done again) by run and by rank over the time range, and the ranks
that make the others wait (stragglers), judged as TrainingStraggler judges them."""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard, Row

from ....catalogue import TRAINING_LOST, TRAINING_RESTARTS, TRAINING_STEPS, TRAINING_TIME
from ...config import Config
from ...rules.straggler import PHASES
from ..panels import RUN_LEGEND, Queries, merged_table, single_stat

BY_RUN = "job, run_id"
BY_RANK = "job, run_id, instance, rank"


def steps(q: Queries) -> str:
    """Each rank's training steps per second over the time range."""
    return q.rate(TRAINING_STEPS.name, by=BY_RANK, matchers=q.run, window="$__range")


def excess(q: Queries) -> str:
    """Per rank and phase, over the time range: its badput seconds per training step less the run's median
    rank's."""
    time = q.rate(TRAINING_TIME.name, by=f"{BY_RANK}, phase", matchers=f'{q.run}, phase=~"{"|".join(PHASES)}"',
                  window="$__range")  # fmt: skip
    badput = f"{time} / on ({BY_RANK}) group_left () ({steps(q)} > 0)"
    return f"({badput} - on ({BY_RUN}, phase) group_left () quantile by ({BY_RUN}, phase) (0.5, {badput}))"


def life_goodput(q: Queries) -> str:
    """Each run's goodput over its whole life, as ``run:training_goodput:ratio_life`` takes it: the counters' values
    (a rank carries them across its restarts), step less lost over every phase, each rank once (the larger of its
    instances' values, after a restart on another instance)."""
    by_rank = f"{BY_RUN}, rank"
    step = f'sum by ({BY_RUN}) (max by ({by_rank}) ({TRAINING_TIME.name}{{{q.rank}, phase="step"}}))'
    lost = f"sum by ({BY_RUN}) (max by ({by_rank}) ({TRAINING_LOST.name}{{{q.rank}}}))"
    total = f"sum by ({BY_RUN}) (max by ({by_rank}, phase) ({TRAINING_TIME.name}{{{q.rank}}}))"
    return f"({step} - {lost} or {step}) / on ({BY_RUN}) ({total} > 0)"


def restart_costs(q: Queries, by: str) -> tuple[str, str, str, str]:
    """By ``by`` (per rank), over the time range: the time its restarts cost (recovery and lost work), its restarts,
    its recovery and its lost work, in seconds."""
    recovery = q.increase(TRAINING_TIME.name, by, matchers=f'{q.rank}, phase="recovery"')
    lost = q.increase(TRAINING_LOST.name, by)
    restarts = f"round({q.increase(TRAINING_RESTARTS.name, by)})"
    return f"({recovery} + {lost} or {recovery})", restarts, recovery, lost


def row(board: Dashboard, c: Config, q: Queries) -> Dashboard:
    run_seconds = f"quantile by ({BY_RUN}) (0.5, 1 / ({steps(q)} > 0))"  # the median rank's wall time per step
    share = f"topk by ({BY_RANK}) (1, {excess(q)} / on ({BY_RUN}) group_left () {run_seconds}) > 0"
    seconds = f"{excess(q)} and on ({BY_RANK}, phase) ({share})"
    rank_cost, rank_restarts, rank_recovery, rank_lost = restart_costs(q, BY_RANK)
    run_cost, _, run_recovery, run_lost = restart_costs(q, BY_RUN)
    return (
        board.with_row(Row("Run health"))
        .with_panel(
            single_stat(
                "Goodput over the run's life",
                "Each run's goodput from the start of its ranks' first processes to now: their training steps' time, "
                "less the steps done again after a restart, over all their time, the recovery between processes "
                "included. A rank's training time, lost work and restarts go on across its restarts, so this is "
                "the run's account over its whole life, whatever the time range. Red below the TrainingGoodputLow "
                f"threshold ({c.goodput_min:.0%}).",
                "percentunit",
                life_goodput(q),
                steps=((None, "red"), (c.goodput_min, "green")),
                legend=RUN_LEGEND,
                width=6,
                height=8,
                instant=True,  # its value now: at 2,048 ranks a range of it takes half a minute (rule_scale.py)
            )
        )
        .with_panel(
            merged_table(
                "Restarts by run",
                "What restarts cost each run over the time range, over its selected ranks: the time lost (recovery "
                "and lost work), the most restarts of one rank (a launcher that restarts every rank counts once), "
                "the ranks that restarted, the recovery (from the end of a rank's process to the start of the next) "
                "and the lost work (the step time of steps done again, back from the checkpoint the next process "
                "resumed from). Seconds add up over the ranks.",
                "s",
                {"run_id": "Run"},
                (run_cost, "Time lost", None),
                (f"max by ({BY_RUN}) ({rank_restarts})", "Restarts", "short"),
                (f"count by ({BY_RUN}) ({rank_restarts} > 0)", "Ranks restarted", "short"),
                (run_recovery, "Recovery", None),
                (run_lost, "Lost work", None),
                width=18,
                height=8,
            )
        )
        .with_panel(
            merged_table(
                "Ranks that restarted",
                "The selected ranks whose restarts cost time over the time range, the one that lost the most first: "
                "the time lost (recovery and lost work), its restarts, its recovery (from the end of its process to "
                "the start of the next) and its lost work (the step time of steps it did again). A rank that "
                "restarts alone points at its machine or its data; every rank at once, at the launcher or a "
                "collective.",
                "s",
                {"run_id": "Run", "instance": "Instance", "rank": "Rank"},
                (f"{rank_cost} > 0", "Time lost", None),
                (f"{rank_restarts} > 0", "Restarts", "short"),
                (f"{rank_recovery} > 0", "Recovery", None),
                (f"{rank_lost} > 0", "Lost work", None),
                width=24,
                height=8,
                limit=10,
            )
        )
        .with_panel(
            merged_table(
                "Ranks that hold the run back",
                "In data-parallel training every rank waits for the slowest at each collective, inside its step. A "
                "rank that spends more time per training step than the run's median rank in one phase (data, "
                "compile, host_sync, checkpoint) makes the others wait about that long: each rank's largest such "
                "excess over the time range, as a share of the run's time per step and in seconds per step, the "
                "rank that costs the most first. TrainingStraggler fires for a rank above "
                f"{c.straggler_excess_share:.0%} for {c.straggler_for}. A rank slow inside its device step shows here "
                "as nothing: its wait is the others' step time.",
                "percentunit",
                {"run_id": "Run", "instance": "Instance", "rank": "Rank", "phase": "Phase"},
                (share, "Share of the run's step time", None),
                (seconds, "Excess per step", "s"),
                width=24,
                height=8,
                limit=10,
            )
        )
    )
