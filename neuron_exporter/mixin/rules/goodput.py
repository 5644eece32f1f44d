"""The goodput alert, every backend: a run whose training steps take too small a share of its training threads'
time, with the phase that takes the most of the rest and what to do about it. Goodput is what the recording rules
call it: the steps' time less the steps done again after a restart (lost work), over all the time.

It judges a run while it trains: over the ranks that are live and had started before its window began. A start-up
(the first compilations too) is TrainingStartupSlow's to judge, against a threshold of its own; a run that ended,
whose last values the node endpoint may serve for an hour, is not judged at all."""

from __future__ import annotations

from ...catalogue import TRAINING_LOST, TRAINING_TIME
from ..config import Config
from .promql import RANK, alert, fill, labels, rank_lookup, run_name, select
from .rank_filters import live_ranks, started_ranks
from .recording import RANK_GOODPUT

# What to do about each badput phase, for the alert's description (Go template text, by the phase's label).
ADVICE = {
    "compile": "see the recompilation alerts and the recompilation sites (neuron-exporter diagnose URL): a shape or "
    "Python value that changes between steps, or a cold compile cache",
    "host_sync": "see the host-read sites (neuron-exporter diagnose URL): an .item(), print or if on a tensor inside "
    "the step waits for the device",
    "data": "the input pipeline cannot keep up: more DataLoader workers, pin_memory, prefetching, or lighter "
    "per-sample work; the rank table of the Training overview dashboard shows whether one rank's input makes the "
    "others wait",
    "checkpoint": "checkpoints take too long: save less often, or asynchronously (torch.distributed.checkpoint's "
    "async_save)",
    "startup": "the job spends its time starting: imports, model building or loading before the first optimizer step "
    "(see TrainingStartupSlow); a long job amortises it, a short or restarting one does not",
    "other": "time after the last training step (an evaluation at the end, a final save)",
    "recovery": "the ranks' processes ended and the launcher started them again: the time in between counts. Find "
    "why they ended (NeuronExporterRankDead, the launcher's and the kernel's logs) and how long a restart takes; the "
    "Run health row of the Training overview dashboard has each run's and rank's restarts, recovery and work done "
    "again",
}


def phase_advice() -> str:
    """A template of what to do about the ``phase`` label's badput phase (ADVICE), for an alert's description."""
    return "".join(
        fill('{{ if eq (label "phase" .) ${phase} }}${text}{{ end }}', phase=f'"{phase}"', text=text)
        for phase, text in ADVICE.items()
    )


def goodput_alerts(c: Config) -> list[dict]:
    the_run = run_name(c)
    run = labels(*c.run_labels)
    advice = phase_advice()
    largest = rank_lookup(
        c,
        'topk(1, sum by (phase) (rate(${time}{${match}, phase!="step"}[${window}])) '
        "/ scalar(sum(rate(${time}{${match}}[${window}]))))",
        fill(
            ' The largest badput is {{ label "phase" . }}, {{ value . | humanizePercentage }} of the time: ${advice}.',
            advice=advice,
        ),
        window=c.goodput_window,
        time=TRAINING_TIME.name,
    )
    lowest = rank_lookup(
        c,
        "bottomk(1, ${record}{${match}})",
        fill(" The rank with the lowest goodput: ${rank}, {{ value . | humanizePercentage }}.", rank=RANK),
        with_selector=False,
        record=RANK_GOODPUT,
    )
    return [
        alert(
            c,
            "TrainingGoodputLow",
            c.goodput_for,
            c.goodput_severity,
            expr=fill(
                """
                clamp_min(
                  sum by (${run}) (
                    (
                      sum by (${rank}) (rate(${step}[${window}]))
                      - sum by (${rank}) (rate(${lost}[${window}]))
                      or sum by (${rank}) (rate(${step}[${window}]))
                    )
                    and on (${rank}) (${started})
                    and on (${rank}) (${live})
                  ),
                  0
                )
                / on (${run})
                (sum by (${run}) (
                  rate(${all}[${window}])
                  and on (${rank}) (${started})
                  and on (${rank}) (${live})
                ) > 0)
                < ${minimum}
                """,
                run=run,
                rank=labels(*c.rank_labels),
                step=select(c, TRAINING_TIME.name, 'phase="step"'),
                lost=select(c, TRAINING_LOST.name),
                all=select(c, TRAINING_TIME.name),
                window=c.goodput_window,
                started=started_ranks(c, c.goodput_window),
                live=live_ranks(c),
                minimum=f"{c.goodput_min:g}",
            ),
            summary=fill("Little of ${run_name}'s time trains the model", run_name=the_run),
            description=fill(
                "Training steps, less any done again after a restart, took {{ $value | humanizePercentage }} of "
                "${run_name}'s training threads' time over the last ${window}, start-up left out (goodput; the "
                "alert's threshold is ${minimum_percent})."
                "${largest}${lowest}",
                run_name=the_run,
                window=c.goodput_window,
                minimum_percent=f"{c.goodput_min * 100:g}%",
                largest=largest,
                lowest=lowest,
            ),
        )
    ]
