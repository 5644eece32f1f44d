"""Synthetic data-parallel runs for the straggler alert (tests/assets/test_straggler_alert.py and
benchmarks/straggler_false_positives.py): every rank's training-time, step and CPU-time counters at each 15 s scrape.

The ranks step together, two steps a second (0.5 s a step), and each rank's phases add up to the 15 s between two
scrapes. What varies is what varies between ranks that share machines: each rank's wait for data and on the device
differs for good (``bias``) and from step to step (``jitter``); a rank now and then compiles for a few seconds
(a new shape); rank 0 saves a checkpoint every ``checkpoint_every`` scrapes. The others wait for the straggler
inside their steps: its input is ``straggler_data`` seconds a step slower, and its step time shorter by as much.
"""

from __future__ import annotations

import dataclasses
import math
import random

INTERVAL = 15  # seconds between scrapes
STEPS = 30  # training steps between two scrapes, every rank


@dataclasses.dataclass(frozen=True)
class Noise:
    data: float = 0.02  # seconds a step waiting for data, the typical rank
    host_sync: float = 0.01  # seconds a step waiting for device data
    bias: float = 0.3  # each rank's own share of that, for good: within 1 +- bias
    jitter: float = 1.0  # sigma of the log-normal variation from one step to the next (its mean stays the same)
    compile_chance: float = 0.002  # per rank and scrape: a one-off compilation
    compile_seconds: float = 3.0
    checkpoint_every: int = 40  # scrapes between rank 0's saves
    checkpoint_seconds: float = 2.0


def rank_labels(run: str, rank: int, ranks_per_node: int = 8) -> str:
    return (
        f'cluster="c1", namespace="ml", job="neuron-exporter", run_id="{run}", '
        f'instance="trn{rank // ranks_per_node}:19478", rank="{rank}", local_rank="{rank % ranks_per_node}"'
    )


def run_series(
    run: str,
    ranks: int,
    samples: int,
    rng: random.Random,
    noise: Noise = Noise(),
    straggler: int | None = None,
    straggler_data: float = 0.1,
) -> list[tuple[str, list[float]]]:
    """(series, its value at each of ``samples`` + 1 scrapes from 0) of every rank of a run."""
    series = []
    for rank in range(ranks):
        labels = rank_labels(run, rank)
        bias = rng.uniform(1 - noise.bias, 1 + noise.bias)
        phases: dict[str, list[float]] = {phase: [] for phase in ("data", "host_sync", "compile", "checkpoint")}
        for sample in range(samples):
            phases["data"].append(waits(rng, noise.data * bias, noise.jitter))
            phases["host_sync"].append(waits(rng, noise.host_sync * bias, noise.jitter))
            compiles = rng.random() < noise.compile_chance
            phases["compile"].append(noise.compile_seconds if compiles else 0.0)
            saves = rank == 0 and sample % noise.checkpoint_every == noise.checkpoint_every - 1
            phases["checkpoint"].append(noise.checkpoint_seconds if saves else 0.0)
            if rank == straggler:
                phases["data"][-1] += STEPS * straggler_data
            # The phases share the 15 s: a rare wait longer than what is left leaves the step 1 s of it.
            others = sum(phases[phase][-1] for phase in ("host_sync", "compile", "checkpoint"))
            phases["data"][-1] = min(phases["data"][-1], INTERVAL - 1 - others)
        phases["step"] = [INTERVAL - sum(phase[i] for phase in phases.values()) for i in range(samples)]
        phases["startup"] = phases["other"] = [0.0] * samples
        for phase, increments in phases.items():
            series.append((f'training_time_seconds_total{{{labels}, phase="{phase}"}}', totals(increments)))
        series.append((f"training_steps_total{{{labels}}}", totals([STEPS] * samples)))
        series.append((f"training_process_cpu_seconds_total{{{labels}}}", totals([7.5] * samples)))
    return series


def waits(rng: random.Random, mean: float, sigma: float) -> float:
    """The waits of the steps between two scrapes, each log-normal around ``mean``."""
    mu = math.log(mean) - sigma * sigma / 2 if mean > 0 else 0.0
    return sum(rng.lognormvariate(mu, sigma) for _ in range(STEPS)) if mean > 0 else 0.0


def totals(increments: list[float]) -> list[float]:
    """A counter's values from 0, one increment after another."""
    values, total = [0.0], 0.0
    for increment in increments:
        total += increment
        values.append(total)
    return values
