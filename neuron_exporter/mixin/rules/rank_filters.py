"""Which ranks the training-time alerts count: *live* ranks, whose process's CPU-time counter still rises, *started*
ones, past their first training steps, and *starting* ones, not yet past them (all along a window, for a rank that
restarted). Each is a per-rank vector (``aggregation_labels`` + instance, rank, local_rank) for ``and on (...)``.

Live is judged from a series moving, not from its presence: the node endpoint serves a finished or dead rank's last
values for up to an hour. The training-time counters move only when a phase ends (a step, a batch, a save), so they
stand still through a long step or evaluation of a live process; the process's CPU-time counter moves at every
spool write, and stops with the process.

A rank carries its training time, lost work and restarts across its restarts (they are the run's); its step and
CPU-time counters are its process's, and start again with each.
"""

from __future__ import annotations

from ...catalogue import PROCESS_CPU, TRAINING_RESTARTS, TRAINING_STEPS, TRAINING_TIME
from ..config import Config
from .promql import fill, labels, select


def live_ranks(c: Config) -> str:
    """The ranks whose process used CPU time within ``live_window``."""
    return fill(
        "sum by (${rank}) (rate(${cpu}[${window}])) > 0",
        rank=labels(*c.rank_labels),
        cpu=select(c, PROCESS_CPU.name),
        window=c.live_window,
    )


def started_ranks(c: Config, window: str) -> str:
    """The ranks that had made their ``startup_steps`` training steps at the first sample of ``window``: all of
    the window comes after their start-up (a restarted process, its counter reset, starts again)."""
    return fill(
        "min by (${rank}) (min_over_time(${steps}[${window}])) >= ${startup_steps}",
        rank=labels(*c.rank_labels),
        steps=select(c, TRAINING_STEPS.name),
        window=window,
        startup_steps=f"{c.startup_steps:g}",
    )


def starting_ranks(c: Config) -> str:
    """The ranks that have not made their ``startup_steps`` training steps yet."""
    return fill(
        "max by (${rank}) (${steps}) < ${startup_steps}",
        rank=labels(*c.rank_labels),
        steps=select(c, TRAINING_STEPS.name),
        startup_steps=f"{c.startup_steps:g}",
    )


def starting_all_along(c: Config, window: str) -> str:
    """The ranks whose process has been starting for all of ``window``, where their training time cannot tell: a
    rank that restarted carries its training time over from its earlier processes, so it passes once it has made no
    ``startup_steps`` training steps in all of ``window`` (its step counter starts again with each process) and its
    steps were served at the window's start (a rank that restarted on another instance is a new series there). A
    rank that never restarted passes: its training time is its process's."""
    return fill(
        """
        (
          max by (${rank}) (max_over_time(${steps}[${window}])) < ${startup_steps}
          and on (${rank}) max by (${rank}) (${steps} offset ${window})
        )
        or on (${rank})
        (
          max by (${rank}) (${time})
          unless on (${rank}) (max by (${rank}) (${restarts}) > 0)
        )
        """,
        rank=labels(*c.rank_labels),
        steps=select(c, TRAINING_STEPS.name),
        time=select(c, TRAINING_TIME.name),
        restarts=select(c, TRAINING_RESTARTS.name),
        window=window,
        startup_steps=f"{c.startup_steps:g}",
    )
