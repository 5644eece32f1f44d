"""The "Goodput: where the time goes" row: the share of the training thread's time spent in steps, less the steps done
again after a restart (lost work), by run; where the rest goes, by phase and lost work; and which rank loses the
most. Goodput is what the recording rules call it (rules/recording.py)."""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard, Row

from ....catalogue import TRAINING_LOST, TRAINING_TIME
from ...config import Config
from ..panels import BY_RUN, RUN_LEGEND, Queries, graph, merged_table

PHASE_COLUMNS = {"data": "Data", "compile": "Compile", "host_sync": "Host sync", "checkpoint": "Checkpoint",
                 "startup": "Startup", "other": "Other", "recovery": "Recovery"}  # fmt: skip


def time_share(q: Queries, by: str, phase: str, window: str = "$__rate_interval") -> str:
    """The share of the training thread's time spent in ``phase`` (a matcher: ``phase="step"``), by ``by``."""
    return (
        f"{q.rate(TRAINING_TIME.name, by=by, matchers=f'{q.rank}, {phase}', window=window)}"
        f" / on ({by}) group_left () ({q.rate(TRAINING_TIME.name, by=by, window=window)} > 0)"
    )


def goodput_share(q: Queries, by: str, window: str = "$__rate_interval") -> str:
    """Goodput by ``by``: the steps' time less the lost work over all the time, as ``run:training_goodput:ratio5m``
    takes it (0 at the least, where a restarted process counts more lost work than the window's steps)."""
    step = q.rate(TRAINING_TIME.name, by=by, matchers=f'{q.rank}, phase="step"', window=window)
    lost = q.rate(TRAINING_LOST.name, by=by, window=window)
    total = q.rate(TRAINING_TIME.name, by=by, window=window)
    return f"clamp_min({step} - {lost} or {step}, 0) / on ({by}) ({total} > 0)"


def lost_share(q: Queries, by: str, window: str = "$__rate_interval") -> str:
    """The share of the training thread's time in steps done again after a restart, by ``by``."""
    lost = q.rate(TRAINING_LOST.name, by=by, window=window)
    return f"{lost} / on ({by}) ({q.rate(TRAINING_TIME.name, by=by, window=window)} > 0)"


def badput_share(q: Queries, by: str, window: str) -> str:
    """The share of the training thread's time outside goodput, by ``by``: every phase but step, and the lost work."""
    other = q.rate(TRAINING_TIME.name, by=by, matchers=f'{q.rank}, phase!="step"', window=window)
    lost = q.rate(TRAINING_LOST.name, by=by, window=window)
    return f"({other} + {lost} or {other}) / on ({by}) ({q.rate(TRAINING_TIME.name, by=by, window=window)} > 0)"


def row(board: Dashboard, c: Config, q: Queries) -> Dashboard:
    by_rank = "run_id, instance, rank"
    board = (
        board.with_row(Row("Goodput: where the time goes"))
        .with_panel(
            graph(
                "Goodput by run",
                "The share of each run's training-thread time spent in training steps, less the steps done again "
                "after a restart, over its selected ranks (the training time by phase, every backend). The rest is "
                "badput, by phase on the right. The dashed line is the TrainingGoodputLow threshold.",
                "percentunit",
                (goodput_share(q, BY_RUN), RUN_LEGEND),
                threshold=c.goodput_min,
            )
        )
        .with_panel(
            graph(
                "Badput by phase",
                "Where the rest of the selected ranks' training-thread time goes: startup (before the first "
                "optimizer), data (waiting for the next batch), compile, host_sync (waiting for device data), "
                "checkpoint, other (after the last step), recovery (between a rank's process that ended and the next "
                "one), and lost work (steps done again after a restart, inside the step time). Stacked: with "
                "goodput, they add up to 1.",
                "percentunit",
                (time_share(q, "phase", 'phase!="step"'), "{{phase}}"),
                (lost_share(q, ""), "lost work"),
                stacked=True,
            )
        )
    )
    columns = [(badput_share(q, by_rank, "$__range"), "Badput", None)]
    columns += [
        (time_share(q, by_rank, f'phase="{phase}"', "$__range"), header, None)
        for phase, header in PHASE_COLUMNS.items()
    ]
    columns.append((lost_share(q, by_rank, "$__range"), "Lost work", None))
    return board.with_panel(
        merged_table(
            "Goodput by rank",
            "Each selected rank's badput over the time range, and its share of each phase and of lost work (steps "
            "done again after a restart): the rank at the top loses the most. A rank whose data share stands out is "
            "the one whose input pipeline makes the others wait; one whose compile or host_sync share stands out "
            "compiles or reads the device more than the others (neuron-exporter diagnose URL names the lines); "
            "recovery and lost work are what its restarts cost.",
            "percentunit",
            {"run_id": "Run", "instance": "Instance", "rank": "Rank"},
            *columns,
            width=24,
            height=8,
        )
    )
