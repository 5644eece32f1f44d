"""The "Goodput: where the time goes" row: the share of the training thread's time spent in steps, by run; where the
rest goes, by phase; and which rank loses the most."""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard, Row

from ....catalogue import TRAINING_TIME
from ...config import Config
from ..panels import BY_RUN, RUN_LEGEND, Queries, graph, merged_table

PHASE_COLUMNS = {"data": "Data", "compile": "Compile", "host_sync": "Host sync", "checkpoint": "Checkpoint",
                 "startup": "Startup", "other": "Other"}  # fmt: skip


def time_share(q: Queries, by: str, phase: str, window: str = "$__rate_interval") -> str:
    """The share of the training thread's time spent in ``phase`` (a matcher: ``phase="step"``), by ``by``."""
    return (
        f"{q.rate(TRAINING_TIME.name, by=by, matchers=f'{q.rank}, {phase}', window=window)}"
        f" / on ({by}) group_left () ({q.rate(TRAINING_TIME.name, by=by, window=window)} > 0)"
    )


def row(board: Dashboard, c: Config, q: Queries) -> Dashboard:
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
