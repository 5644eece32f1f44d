"""Throughput, every backend: the work the training steps do (samples, tokens and FLOPs per second, per rank and per
run), each run's peak and its MFU.

The counters are the process's: a restarted process counts from 0, which rate() takes as a counter reset. MFU is the
FLOP/s of a run's live ranks over their peaks, recorded only where every live rank that counts FLOPs serves a peak: a
share of an unknown whole means nothing."""

from __future__ import annotations

from ...catalogue import TRAINING_FLOPS, TRAINING_PEAK_FLOPS, TRAINING_SAMPLES, TRAINING_TOKENS
from ..config import Config
from .promql import fill, labels, select
from .rank_filters import live_ranks

WINDOW = "5m"

# Recording rule names.
RANK_SAMPLES = f"rank:training_samples:rate{WINDOW}"
RANK_TOKENS = f"rank:training_tokens:rate{WINDOW}"
RANK_FLOPS = f"rank:training_flops:rate{WINDOW}"
RUN_SAMPLES = f"run:training_samples:rate{WINDOW}"
RUN_TOKENS = f"run:training_tokens:rate{WINDOW}"
RUN_FLOPS = f"run:training_flops:rate{WINDOW}"
RUN_PEAK = "run:training_peak_flops:sum"
RUN_MFU = f"run:training_mfu:ratio{WINDOW}"


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
