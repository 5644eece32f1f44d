"""The straggler alert, every backend: the rank that holds a data-parallel run back, and the phase that explains it.

In data-parallel training every rank waits for the slowest at each collective, inside its step: the victims' wait
is ``step`` time, and every rank's goodput looks fine while the run goes at the straggler's pace. The straggler is
the rank whose own badput per training step (data, compile, host_sync, checkpoint) exceeds the run's median rank's:
the median, because one straggler among many ranks does not move it, and the victims, whose badput is the median's,
never fire. The excess is judged as a share of the run's time per step (its median rank's wall time per step), what
the run would gain without it.

What the host cannot see: a rank slow inside its device step (a slow chip, a slow link) shows as the others' wait,
not as its own badput; and where the victims wait in the same phase as the straggler's cause (on an XLA device the
wait for the device may show in the next batch or host read), the excess disappears.
"""

from __future__ import annotations

from ...catalogue import TRAINING_STEPS, TRAINING_TIME
from ..config import Config
from .promql import alert, fill, labels, rank_lookup, run_name, select
from .rank_filters import live_ranks, started_ranks

WINDOW = "5m"
# The badput phases a rank can make the others wait for; startup, other (and the time between a rank's processes)
# are not while the run trains.
PHASES = ("data", "compile", "host_sync", "checkpoint")

# Recording rule names.
RANK_STEPS = f"rank:training_steps:rate{WINDOW}"
RANK_BADPUT_PER_STEP = f"rank_phase:training_badput_seconds_per_step:ratio{WINDOW}"
RUN_BADPUT_PER_STEP = f"run_phase:training_badput_seconds_per_step:median{WINDOW}"
RUN_SECONDS_PER_STEP = f"run:training_seconds_per_step:median{WINDOW}"

# What to do about the phase that explains a straggler, for the alert's description (Go template text).
ADVICE = {
    "data": "its input pipeline is slower than the others': more DataLoader workers or a lighter per-sample load on "
    "its host, a local copy of its shard, or a more even split of the data (longer samples, a larger shard); check "
    "its host's CPU, disk and network",
    "compile": "it compiles when the others do not: shapes or Python values that differ on this rank (a shorter "
    "last batch, a branch on the rank) or a compile cache it does not find; its recompilation sites are in "
    "neuron-exporter diagnose URL",
    "host_sync": "it reads device data on the host where the others do not (logging, metrics or checks on one rank): "
    "read after the step, every N steps, or on the device; neuron-exporter diagnose URL names the lines",
    "checkpoint": "it saves or loads while the others wait: save asynchronously (torch.distributed.checkpoint's "
    "async_save), spread the save over all ranks (a sharded checkpoint), or save less often",
}


def straggler_recording_rules(c: Config) -> dict[str, str]:
    """{name: expression}, in evaluation order: per rank, its training steps per second and its badput seconds
    per step by phase; per run, the median rank's badput seconds per step by phase and wall seconds per step (the
    inverse of its step rate). No value while a rank makes no training step."""
    rank = labels(*c.rank_labels)
    run = labels(*c.run_labels)
    phases = "|".join(PHASES)
    return {
        RANK_STEPS: fill(
            "sum by (${rank}) (rate(${steps}[${window}]))",
            rank=rank,
            steps=select(c, TRAINING_STEPS.name),
            window=WINDOW,
        ),
        RANK_BADPUT_PER_STEP: fill(
            """
            sum by (${rank}, phase) (rate(${badput}[${window}]))
            / on (${rank}) group_left ()
            (${steps} > 0)
            """,
            rank=rank,
            badput=select(c, TRAINING_TIME.name, f'phase=~"{phases}"'),
            window=WINDOW,
            steps=RANK_STEPS,
        ),
        RUN_BADPUT_PER_STEP: fill("quantile by (${run}, phase) (0.5, ${badput})", run=run, badput=RANK_BADPUT_PER_STEP),
        RUN_SECONDS_PER_STEP: fill("quantile by (${run}) (0.5, 1 / (${steps} > 0))", run=run, steps=RANK_STEPS),
    }


def excess_share(c: Config) -> str:
    """Per rank and phase: its badput seconds per step less the run's median rank's, as a share of the run's
    seconds per step."""
    return fill(
        """
        (
          ${badput}
          - on (${run}, phase) group_left ()
          ${median_badput}
        )
        / on (${run}) group_left ()
        (${run_seconds} > 0)
        """,
        run=labels(*c.run_labels),
        badput=RANK_BADPUT_PER_STEP,
        median_badput=RUN_BADPUT_PER_STEP,
        run_seconds=RUN_SECONDS_PER_STEP,
    )


def straggler_alerts(c: Config) -> list[dict]:
    the_run = run_name(c)
    run = labels(*c.run_labels)
    rank = labels(*c.rank_labels)
    advice = "".join(
        fill("{{ if eq $labels.phase ${phase} }}${text}{{ end }}", phase=f'"{phase}"', text=text)
        for phase, text in ADVICE.items()
    )
    seconds = '{{ value . | printf "%.3g" }} s'
    its_own = rank_lookup(
        c,
        "${record}{${match}}",
        seconds,
        "instance",
        "rank",
        "local_rank",
        "phase",
        with_selector=False,
        record=RANK_BADPUT_PER_STEP,
    )
    typical = rank_lookup(c, "${record}{${match}}", seconds, "phase", with_selector=False, record=RUN_BADPUT_PER_STEP)
    per_step = rank_lookup(c, "${record}{${match}}", seconds, with_selector=False, record=RUN_SECONDS_PER_STEP)
    return [
        alert(
            c,
            "TrainingStraggler",
            c.straggler_for,
            c.straggler_severity,
            expr=fill(
                """
                topk by (${rank}) (1,
                  (
                    ${excess}
                  ) > ${share}
                  and on (${run}) (count by (${run}) (${rank_steps} > 0) >= ${min_ranks})
                  and on (${rank}) (sum by (${rank}) (increase(${steps}[${window}])) >= ${min_steps})
                  and on (${rank}) (${started})
                  and on (${rank}) (${live})
                )
                """,
                rank=rank,
                run=run,
                excess=excess_share(c).replace("\n", "\n    "),
                share=f"{c.straggler_excess_share:g}",
                rank_steps=RANK_STEPS,
                min_ranks=f"{c.straggler_min_ranks:g}",
                steps=select(c, TRAINING_STEPS.name),
                window=WINDOW,
                min_steps=f"{c.straggler_min_steps:g}",
                started=started_ranks(c, WINDOW),
                live=live_ranks(c),
            ),
            summary=fill("Rank {{ $labels.rank }} holds back ${run_name} ({{ $labels.phase }})", run_name=the_run),
            description=fill(
                "Rank {{ $labels.rank }} (local rank {{ $labels.local_rank }}) of {{ $labels.instance }} spends "
                "more time in {{ $labels.phase }} per training step than the median rank of ${run_name}, over the "
                "last ${window}: ${its_own} against ${typical}, {{ $value | humanizePercentage }} of the run's "
                "${per_step} per step (the alert's threshold is ${share_percent}). In data-parallel training the "
                "other ranks wait for it at their collectives, inside their steps, so the run goes at its pace. "
                "What to do: ${advice}.",
                run_name=the_run,
                window=WINDOW,
                its_own=its_own,
                typical=typical,
                per_step=per_step,
                share_percent=f"{c.straggler_excess_share * 100:g}%",
                advice=advice,
            ),
        )
    ]
