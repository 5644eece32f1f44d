"""Throughput, every backend: the work the training steps do (samples, tokens and FLOPs per second, per rank and per
run), each run's peak and its MFU; and the alerts on them. TrainingThroughputDropped: a run whose work rate (tokens
per second, samples per second for a run without token ids) fell well below its own recent level, with the badput
phase that grew the most between the two windows and what to do about it. TrainingPeakFlopsTooLow: a run whose
FLOP/s exceed the peak its ranks serve, so that the peak, and its MFU, are wrong.

The counters are the process's: a restarted process counts from 0, which rate() takes as a counter reset. A run in
recovery (its processes ended and the next ones not training yet) works at a lower rate: a real drop, whose phase is
recovery. MFU is the FLOP/s of a run's live ranks over their peaks, recorded only where every live rank that counts
FLOPs serves a peak: a share of an unknown whole means nothing."""

from __future__ import annotations

import math

from ...catalogue import TRAINING_FLOPS, TRAINING_PEAK_FLOPS, TRAINING_SAMPLES, TRAINING_STEPS, TRAINING_TOKENS
from ..config import Config
from .goodput import phase_advice
from .promql import RANK, alert, duration_seconds, fill, labels, rank_lookup, run_name, select
from .rank_filters import live_ranks
from .recording import RUN_BADPUT
from .startup import duration_text

WINDOW = "5m"
# A badput phase named as the drop's cause grew by at least this share of the run's time: a drop of a third in the
# rate, at the same work per step, is about that much more time per step.
MIN_GROWTH = 0.05

# Recording rule names.
RANK_SAMPLES = f"rank:training_samples:rate{WINDOW}"
RANK_TOKENS = f"rank:training_tokens:rate{WINDOW}"
RANK_FLOPS = f"rank:training_flops:rate{WINDOW}"
RUN_SAMPLES = f"run:training_samples:rate{WINDOW}"
RUN_TOKENS = f"run:training_tokens:rate{WINDOW}"
RUN_FLOPS = f"run:training_flops:rate{WINDOW}"
RUN_PEAK = "run:training_peak_flops:sum"
RUN_MFU = f"run:training_mfu:ratio{WINDOW}"

# What a run's work rate is judged by, in this order: its tokens, else its samples (a run without token ids); the
# counter and the per-run record of each.
WORK = {"tokens": (TRAINING_TOKENS.name, RUN_TOKENS), "samples": (TRAINING_SAMPLES.name, RUN_SAMPLES)}


def throughput_recording_rules(c: Config) -> dict[str, str]:
    """{name: expression}, in evaluation order: per rank, its samples, tokens and FLOPs per second; per run, their
    sums over its ranks, its peak (``training_peak_flops`` summed over its live ranks) and its MFU (the FLOP/s of its
    live ranks over that peak), where at least one of its live ranks counts FLOPs and every one that does serves a
    peak."""
    rank = labels(*c.rank_labels)
    run = labels(*c.run_labels)
    live = live_ranks(c)

    def rank_rate(counter: str) -> str:
        return fill(
            "sum by (${rank}) (rate(${counter}[${window}]))", rank=rank, counter=select(c, counter), window=WINDOW
        )

    def run_sum(record: str) -> str:
        return fill("sum by (${run}) (${record})", run=run, record=record)

    counting = fill(
        "max by (${rank}) (${flops}) > 0\nand on (${rank}) (${live})",
        rank=rank,
        flops=select(c, TRAINING_FLOPS.name),
        live=live,
    )
    return {
        RANK_SAMPLES: rank_rate(TRAINING_SAMPLES.name),
        RANK_TOKENS: rank_rate(TRAINING_TOKENS.name),
        RANK_FLOPS: rank_rate(TRAINING_FLOPS.name),
        RUN_SAMPLES: run_sum(RANK_SAMPLES),
        RUN_TOKENS: run_sum(RANK_TOKENS),
        RUN_FLOPS: run_sum(RANK_FLOPS),
        RUN_PEAK: fill(
            """
            sum by (${run}) (
              max by (${rank}) (${peak})
              and on (${rank}) (${live})
            )
            """,
            run=run,
            rank=rank,
            peak=select(c, TRAINING_PEAK_FLOPS.name),
            live=live,
        ),
        RUN_MFU: fill(
            """
            sum by (${run}) (${flops} and on (${rank}) (${live}))
            / on (${run})
            (${peak} > 0)
            and on (${run}) (
              ${counting}
            )
            unless on (${run}) (
              ${counting}
              unless on (${rank}) ${rank_peak}
            )
            """,
            run=run,
            rank=rank,
            flops=RANK_FLOPS,
            live=live,
            peak=RUN_PEAK,
            counting=counting.replace("\n", "\n  "),
            rank_peak=select(c, TRAINING_PEAK_FLOPS.name),
        ),
    }


def throughput_alerts(c: Config) -> list[dict]:
    return [throughput_dropped(c), peak_flops_too_low(c)]


def throughput_dropped(c: Config) -> dict:
    the_run = run_name(c)
    run = labels(*c.run_labels)
    window_seconds = duration_seconds(WINDOW)
    # The recent window ends before the drop the alert fires for began: its 5m, then its `for` (whole seconds: an
    # offset's duration is whole).
    offset = duration_text(math.ceil(window_seconds + duration_seconds(c.throughput_for)))
    began = duration_text(math.ceil(duration_seconds(c.throughput_recent_window) + duration_seconds(offset)))
    steps = select(c, TRAINING_STEPS.name)

    def share_of_recent(work: str) -> str:
        counter, record = WORK[work]
        return fill(
            """
            label_replace(
              ${record}
              / on (${run})
              (sum by (${run}) (rate(${counter}[${recent}] offset ${offset})) > 0),
              "work", "${work}", "", ""
            )
            """,
            record=record,
            run=run,
            counter=select(c, counter),
            recent=c.throughput_recent_window,
            offset=offset,
            work=work,
        )

    now = "".join(
        fill(
            "{{ if eq $labels.work ${work} }}${lookup}{{ end }}",
            work=f'"{work}"',
            lookup=rank_lookup(
                c,
                "${record}{${match}}",
                " ({{ value . | humanize }} {{ $labels.work }}/s)",
                with_selector=False,
                record=record,
            ),
        )
        for work, (_, record) in WORK.items()
    )
    advice = phase_advice()
    grown = rank_lookup(
        c,
        "topk(1, (${badput}{${match}} - avg_over_time(${badput}{${match}}[${recent}] offset ${offset}))"
        " or ${badput}{${match}}) >= ${growth}",
        fill(
            ' The badput phase that grew the most is {{ label "phase" . }}, {{ value . | humanizePercentage }} more '
            "of the run's time than over its recent window: ${advice}.",
            advice=advice,
        ),
        with_selector=False,
        otherwise=fill(
            " No badput phase grew by ${growth} of the run's time: its training steps themselves take longer (a "
            "slower device or link, a larger model or batch) or do less work each (smaller batches, shorter "
            "sequences); the steps per second by rank (Training overview, Throughput row) tell which, and whether "
            "one rank holds the others back.",
            growth=f"{MIN_GROWTH:.0%}",
        ),
        badput=RUN_BADPUT,
        recent=c.throughput_recent_window,
        offset=offset,
        growth=f"{MIN_GROWTH:g}",
    )
    return alert(
        c,
        "TrainingThroughputDropped",
        c.throughput_for,
        c.throughput_severity,
        expr=fill(
            """
            (
              ${tokens}
              or on (${run})
              ${samples}
            ) < ${level}
            and on (${run}) (max by (${run}) (${steps} offset ${began}))
            and on (${run}) (
              max by (${run}) (rate(${steps}[${recent}] offset ${offset})) * ${window_seconds} >= ${min_steps}
            )
            and on (${run}) (${live})
            """,
            tokens=share_of_recent("tokens").replace("\n", "\n  "),
            samples=share_of_recent("samples").replace("\n", "\n  "),
            run=run,
            level=f"{1 - c.throughput_drop_share:g}",
            steps=steps,
            began=began,
            recent=c.throughput_recent_window,
            offset=offset,
            window_seconds=f"{window_seconds:g}",
            min_steps=f"{c.throughput_min_steps:g}",
            live=live_ranks(c),
        ),
        summary=fill("${run_name}'s {{ $labels.work }} per second dropped", run_name=the_run),
        description=fill(
            "${run_name} trained at {{ $value | humanizePercentage }} of its recent {{ $labels.work }} per second "
            "over the last ${window}${now}: its recent level is its rate over the ${recent} that ended ${offset} "
            "ago, and the alert's threshold is ${level_percent} of it.${grown}",
            run_name=the_run,
            window=WINDOW,
            now=now,
            recent=c.throughput_recent_window,
            offset=offset,
            level_percent=f"{(1 - c.throughput_drop_share) * 100:g}%",
            grown=grown,
        ),
    )


def peak_flops_too_low(c: Config) -> dict:
    the_run = run_name(c)
    furthest = rank_lookup(
        c,
        "topk(1, sum by (${by_rank}) (rate(${flops}{${match}}[${window}]))"
        " / on (${by_rank}) max by (${by_rank}) (${peak}{${match}}))",
        fill(" The rank furthest over its peak: ${rank}, {{ value . | humanizePercentage }}.", rank=RANK),
        by_rank="instance, rank, local_rank",
        flops=TRAINING_FLOPS.name,
        peak=TRAINING_PEAK_FLOPS.name,
        window=WINDOW,
    )
    return alert(
        c,
        "TrainingPeakFlopsTooLow",
        c.peak_flops_for,
        c.peak_flops_severity,
        expr=fill("max by (${run}) (${mfu}) > 1", run=labels(*c.run_labels), mfu=RUN_MFU),
        summary=fill("${run_name}'s MFU is above 100%: its peak FLOP/s are too low", run_name=the_run),
        description=fill(
            "${run_name}'s live ranks did {{ $value | humanizePercentage }} of the FLOP/s of the peak they serve "
            "(${peak}) over the last ${window}: more than their devices can do, so the peak is wrong, and so is "
            "the run's MFU.${furthest} Set the peak_flops option to the peak FLOP/s of one rank's devices for the "
            "data type it trains in (a rank on more NeuronCores than NEURON_RT_VISIBLE_CORES or NEURON_RT_NUM_CORES "
            "name, or in mixed precision under torch.autocast, needs it); or, where a batch's work depends on its "
            "values rather than its shapes (a mixture of experts' routing), the sampled FLOPs count too many.",
            run_name=the_run,
            peak=TRAINING_PEAK_FLOPS.name,
            window=WINDOW,
            furthest=furthest,
        ),
    )
