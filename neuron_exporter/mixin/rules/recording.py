"""The recording rules: per-rank ratios over a fixed 5m window (so their names stay stable), per
``aggregation_labels`` + instance, rank and local_rank, per-run ratios by site, and each run's goodput over 5m and
over its whole life. The alerts read them."""

from __future__ import annotations

from ...catalogue import (
    TRAINING_LOST,
    TRAINING_TIME,
    WARMUP_STEPS,
    XLA_COMPILE_SECONDS,
    XLA_DEVICE_TO_HOST,
    XLA_EXECUTE_SECONDS,
    XLA_FALLBACK_OPS,
    XLA_FRAGMENTED_STEPS,
    XLA_GRAPH_CUTS,
    XLA_GRAPHS_PER_STEP,
    XLA_RECOMPILATIONS,
    XLA_STEP_DURATION,
    XLA_STEP_MARKERS,
    XLA_STEPS,
)
from ..config import DEFAULTS, Config
from .promql import fill, labels, select

WINDOW = "5m"

# Recording rule names.
STEPS = f"rank:xla_steps:rate{WINDOW}"
GRAPHS_PER_STEP = f"rank:xla_graphs_per_step:avg{WINDOW}"
CUTS_PER_STEP = f"rank:xla_graph_cuts_per_step:ratio{WINDOW}"
MARKERS_PER_STEP = f"rank:xla_step_markers_per_step:ratio{WINDOW}"
FRAGMENTED_STEPS = f"rank:xla_fragmented_steps:ratio{WINDOW}"
RECOMPILATIONS_PER_STEP = f"rank:xla_recompilations_per_step:ratio{WINDOW}"
HOST_READS_PER_STEP = f"rank:xla_device_to_host_transfers_per_step:ratio{WINDOW}"
COMPILE_TIME_SHARE = f"rank:xla_compile_time_share:ratio{WINDOW}"
EXECUTE_TIME_SHARE = f"rank:xla_execute_time_share:ratio{WINDOW}"
FALLBACK_RATE = f"rank_op:xla_cpu_fallback_ops:rate{WINDOW}"
# Per run and site: a site's events per training step of the run (its rate summed over the run's ranks, over the
# run's steps summed over its ranks), so the sites of a run add up to the run's own ratio.
SITE_CUTS_PER_STEP = f"run_location:xla_graph_cuts_per_step:ratio{WINDOW}"
SITE_RECOMPILATIONS_PER_STEP = f"run_location:xla_recompilations_per_step:ratio{WINDOW}"
# Goodput, every backend: the share of the training thread's time in training steps, less the steps done again after
# a restart (training_lost_seconds_total, counted inside step), per rank and per run (over the run's ranks); each
# other phase's share per run (badput, recovery included); and the run's goodput over its whole life, from the
# counters' values, which a rank carries across its restarts.
RANK_GOODPUT = f"rank:training_goodput:ratio{WINDOW}"
RUN_GOODPUT = f"run:training_goodput:ratio{WINDOW}"
RUN_BADPUT = f"run_phase:training_badput:ratio{WINDOW}"
RUN_LIFE_GOODPUT = "run:training_goodput:ratio_life"

# -- recording rules -----------------------------------------------------------------------------------------------


def recording_rules(c: Config = DEFAULTS) -> dict[str, str]:
    """{name: expression}; evaluated in this order, so later rules use earlier ones. Per-step ratios have no
    value while a rank (or run) makes no training step (an evaluation phase, a stall): ``> 0`` on the step rate.

    The per-rank ratios sum over the sites of the labelled counters: ``xla_recompilations_total{location}``
    counts recompilations only (a computation compiled again for other shapes or Python values), never new graphs.
    A rank's recompilations per step count only once the rank had made its warm-up steps
    (``neuron_exporter_warmup_steps``) at the window's first sample: the first steps may try a few shapes.
    """
    rank = labels(*c.rank_labels)
    run = labels(*c.run_labels)

    def rate(metric: str) -> str:
        return fill(
            "sum by (${rank}) (rate(${counter}[${window}]))", rank=rank, counter=select(c, metric), window=WINDOW
        )

    def per_step(metric: str) -> str:
        return fill(
            """
            sum by (${rank}) (rate(${counter}[${window}]))
            /
            (${steps} > 0)
            """,
            rank=rank,
            counter=select(c, metric),
            window=WINDOW,
            steps=STEPS,
        )

    def ratio(numerator: str, denominator: str) -> str:
        return fill(
            """
            sum by (${rank}) (rate(${numerator}[${window}]))
            /
            (sum by (${rank}) (rate(${denominator}[${window}])) > 0)
            """,
            rank=rank,
            numerator=select(c, numerator),
            denominator=select(c, denominator),
            window=WINDOW,
        )

    def per_run_step(metric: str, *site: str) -> str:
        # Series without a location (an exporter from before sites) have no site to name.
        return fill(
            """
            sum by (${run_site}) (rate(${counter}[${window}]))
            / on (${run}) group_left
            sum by (${run}) (${steps} > 0)
            """,
            run_site=labels(*c.run_labels, *site),
            run=run,
            counter=select(c, metric, 'location!=""'),
            window=WINDOW,
            steps=STEPS,
        )

    recompilations_after_warmup = fill(
        """
        sum by (${rank}) (rate(${recompilations}[${window}]))
        /
        (${steps} > 0)
        and on (${rank})
        (sum by (${rank}) (min_over_time(${steps_total}[${window}]))
         >= sum by (${rank}) (${warmup_steps}))
        """,
        rank=rank,
        recompilations=select(c, XLA_RECOMPILATIONS.name),
        steps_total=select(c, XLA_STEPS.name),
        warmup_steps=select(c, WARMUP_STEPS.name),
        window=WINDOW,
        steps=STEPS,
    )
    return {
        STEPS: rate(XLA_STEPS.name),
        GRAPHS_PER_STEP: ratio(f"{XLA_GRAPHS_PER_STEP.name}_sum", f"{XLA_GRAPHS_PER_STEP.name}_count"),
        CUTS_PER_STEP: per_step(XLA_GRAPH_CUTS.name),
        MARKERS_PER_STEP: per_step(XLA_STEP_MARKERS.name),
        FRAGMENTED_STEPS: per_step(XLA_FRAGMENTED_STEPS.name),
        RECOMPILATIONS_PER_STEP: recompilations_after_warmup,
        HOST_READS_PER_STEP: per_step(XLA_DEVICE_TO_HOST.name),
        COMPILE_TIME_SHARE: ratio(XLA_COMPILE_SECONDS.name, f"{XLA_STEP_DURATION.name}_sum"),
        EXECUTE_TIME_SHARE: ratio(XLA_EXECUTE_SECONDS.name, f"{XLA_STEP_DURATION.name}_sum"),
        FALLBACK_RATE: fill(
            "sum by (${rank_op}) (rate(${fallback_ops}[${window}]))",
            rank_op=labels(*c.rank_labels, "op"),
            fallback_ops=select(c, XLA_FALLBACK_OPS.name),
            window=WINDOW,
        ),
        SITE_CUTS_PER_STEP: per_run_step(XLA_GRAPH_CUTS.name, "cause", "location"),
        SITE_RECOMPILATIONS_PER_STEP: per_run_step(XLA_RECOMPILATIONS.name, "location"),
        RANK_GOODPUT: goodput(c, rank),
        RUN_GOODPUT: goodput(c, run),
        RUN_BADPUT: ratio_of_time(c, run, 'phase!="step"', by_phase=True),
        RUN_LIFE_GOODPUT: life_goodput(c),
    }


def goodput(c: Config, by: str, window: str = WINDOW) -> str:
    """Goodput summed by ``by`` over ``window``: the training steps' time less the lost work (the steps done again
    after a restart) over all the time counted; no value while no time is counted. Series without the lost counter
    (an exporter from before restarts) count none. A restarted process counts its lost work when it learns of it,
    which may be more than the window's steps: the ratio stops at 0 there, and the life ratio has the exact account.
    """
    return fill(
        """
        clamp_min(
          sum by (${by}) (rate(${step}[${window}]))
          - sum by (${by}) (rate(${lost}[${window}]))
          or sum by (${by}) (rate(${step}[${window}])),
          0
        )
        / on (${by})
        (sum by (${by}) (rate(${all}[${window}])) > 0)
        """,
        by=by,
        step=select(c, TRAINING_TIME.name, 'phase="step"'),
        lost=select(c, TRAINING_LOST.name),
        all=select(c, TRAINING_TIME.name),
        window=window,
    )


def life_goodput(c: Config) -> str:
    """Each run's goodput over its whole life: the counters' values (a rank carries its training time and lost work
    across its restarts, and the recovery phase holds the time between its processes), step less lost over every
    phase, summed over the run's ranks. A rank counts once: after a restart on another instance, the old one may
    serve its last values for an hour beside the new one's, which went on from them (the larger, by rank)."""
    run = labels(*c.run_labels)
    return fill(
        """
        (
          sum by (${run}) (max by (${rank}) (${step}))
          - sum by (${run}) (max by (${rank}) (${lost}))
          or sum by (${run}) (max by (${rank}) (${step}))
        )
        / on (${run})
        (sum by (${run}) (max by (${rank}, phase) (${all})) > 0)
        """,
        run=run,
        rank=labels(*c.run_labels, "run_id", "rank"),
        step=select(c, TRAINING_TIME.name, 'phase="step"'),
        lost=select(c, TRAINING_LOST.name),
        all=select(c, TRAINING_TIME.name),
    )


def ratio_of_time(c: Config, by: str, phases: str, by_phase: bool = False, window: str = WINDOW) -> str:
    """The share of the training thread's time (``training_time_seconds_total``) spent in ``phases``, summed by
    ``by`` (and by phase if ``by_phase``); no value while no time is counted."""
    return fill(
        """
        sum by (${by_phase}) (rate(${phases}[${window}]))
        / on (${by})${group}
        (sum by (${by}) (rate(${all}[${window}])) > 0)
        """,
        by=by,
        group=" group_left ()" if by_phase else "",
        by_phase=labels(by, "phase") if by_phase else by,
        phases=select(c, TRAINING_TIME.name, phases),
        all=select(c, TRAINING_TIME.name),
        window=window,
    )
