"""The "Run health" row: what holds a run back beyond its ranks' own goodput; for now the ranks that make the others
wait (stragglers), judged as TrainingStraggler judges them, over the time range."""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard, Row

from ....catalogue import TRAINING_STEPS, TRAINING_TIME
from ...config import Config
from ...rules.straggler import PHASES
from ..panels import Queries, merged_table

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


def row(board: Dashboard, c: Config, q: Queries) -> Dashboard:
    run_seconds = f"quantile by ({BY_RUN}) (0.5, 1 / ({steps(q)} > 0))"  # the median rank's wall time per step
    share = f"topk by ({BY_RANK}) (1, {excess(q)} / on ({BY_RUN}) group_left () {run_seconds}) > 0"
    seconds = f"{excess(q)} and on ({BY_RANK}, phase) ({share})"
    return board.with_row(Row("Run health")).with_panel(
        merged_table(
            "Ranks that hold the run back",
            "In data-parallel training every rank waits for the slowest at each collective, inside its step. A rank "
            "that spends more time per training step than the run's median rank in one phase (data, compile, "
            "host_sync, checkpoint) makes the others wait about that long: each rank's largest such excess over the "
            "time range, as a share of the run's time per step and in seconds per step, the rank that costs the "
            "most first. TrainingStraggler fires for a rank above "
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
