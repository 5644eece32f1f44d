"""The start-up alert, every backend: ranks of a run still starting, without their first training steps, longer than
a start-up of the model should take (``startup_max_seconds``). A start-up is imports, model building, loading and
the first compilations, the time a rank's training-time counters sum to before its first steps; it is judged here,
on its own, while the rank's process lives, and TrainingGoodputLow leaves it out. A rank that restarted carries its
training time over from its earlier processes: its new process is judged once it has been starting for all of
``startup_max_seconds``."""

from __future__ import annotations

import math
from typing import Any

from ...catalogue import PROCESS_CPU, TRAINING_STEPS, TRAINING_TIME
from ..config import Config
from .promql import RANK, alert, fill, labels, rank_lookup, run_name, select
from .rank_filters import live_ranks, starting_all_along, starting_ranks

# What to do about the phase that takes the most of a slow start-up, for the description (Go template text).
ADVICE = {
    "compile": "a cold compile cache, or a larger model than the threshold was set for: keep the compile cache "
    "across runs (XLA_PERSISTENT_CACHE_PATH, the Neuron compile cache), fill it ahead of the run "
    "(neuron_parallel_compile), and compile fewer graphs (a few fixed input shapes)",
    "startup": "imports, model building or loading before the first optimizer step: load the weights from a local "
    "disk, once per node, or build the model on the meta device",
    "checkpoint": "loading the checkpoint the run resumes from: a local copy, or a sharded load "
    "(torch.distributed.checkpoint)",
    "data": "waiting for the first batches: a dataset indexed or downloaded at start, or workers slow to start",
    "host_sync": "host reads of device data in the first steps",
    "step": "the first training steps themselves",
}

# The ranks of the alert's run that are starting and live, by rank, for the description's template queries.
STARTING_IN_RUN = (
    "sum by (instance, rank, local_rank) (${time}{${match}})"
    " and on (instance, rank, local_rank) (max by (instance, rank, local_rank) (${steps}{${match}}) < ${startup_steps})"
    " and on (instance, rank, local_rank) (sum by (instance, rank, local_rank) (rate(${cpu}{${match}}[${window}])) > 0)"
)


def duration_text(seconds: float) -> str:
    """``seconds`` as a Prometheus-style duration: 1800 -> "30m", 5400 -> "90m", 90 -> "90s"."""
    for unit, size in (("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def startup_alerts(c: Config) -> list[dict]:
    the_run = run_name(c)
    limit = duration_text(c.startup_max_seconds)
    window = duration_text(math.ceil(c.startup_max_seconds))  # a range selector's duration is whole
    values: dict[str, Any] = {  # Any: mypy would take a str for rank_lookup's with_selector
        "time": TRAINING_TIME.name,
        "steps": TRAINING_STEPS.name,
        "cpu": PROCESS_CPU.name,
        "startup_steps": f"{c.startup_steps:g}",
        "window": c.live_window,
    }
    longest = rank_lookup(
        c,
        "topk(1, " + STARTING_IN_RUN + ")",
        fill("${rank}, {{ value . | humanizeDuration }} so far", rank=RANK),
        **values,
    )
    advice = "".join(
        fill('{{ if eq (label "phase" .) ${phase} }}${text}{{ end }}', phase=f'"{phase}"', text=text)
        for phase, text in ADVICE.items()
    )
    largest_part = rank_lookup(
        c,
        "topk(1, ${time}{${match}} and on (instance, rank, local_rank) topk(1, " + STARTING_IN_RUN + "))",
        fill(' Most of it: {{ label "phase" . }} ({{ value . | humanizeDuration }}), ${advice}.', advice=advice),
        **values,
    )
    return [
        alert(
            c,
            "TrainingStartupSlow",
            c.startup_for,
            c.startup_severity,
            expr=fill(
                """
                count by (${run}) (
                  sum by (${rank}) (${time}) > ${max_seconds}
                  and on (${rank}) (${starting})
                  and on (${rank}) (
                    ${all_along}
                  )
                  and on (${rank}) (${live})
                )
                """,
                run=labels(*c.run_labels),
                rank=labels(*c.rank_labels),
                time=select(c, TRAINING_TIME.name),
                max_seconds=f"{c.startup_max_seconds:g}",
                starting=starting_ranks(c),
                all_along=starting_all_along(c, window).replace("\n", "\n    "),
                live=live_ranks(c),
            ),
            summary=fill("Ranks of ${run_name} are still starting after ${limit}", run_name=the_run, limit=limit),
            description=fill(
                "Ranks of ${run_name} have not made their first ${steps} training steps ${limit} after their "
                "processes started (imports, model building, loading, the first compilations; startup_max_seconds "
                "is what a start-up of this model should take). Ranks affected: {{ $value }}; the longest: "
                "${longest}.${largest_part}",
                run_name=the_run,
                steps=f"{c.startup_steps:g}",
                limit=limit,
                longest=longest,
                largest_part=largest_part,
            ),
        )
    ]
