"""A histogram kept by the training thread and exposed at scrape time, and the buckets of step durations."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

# Up to 30 minutes: the steps of large models on many devices take minutes.
STEP_DURATION_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
    1800.0,
    float("inf"),
)


@dataclass
class Histogram:
    """Cumulative-on-read histogram: ``counts[i]`` holds the observations that fell in bucket i only."""

    upper_bounds: tuple[float, ...]
    counts: list[int] = field(init=False)
    total: float = 0.0

    def __post_init__(self):
        self.counts = [0] * len(self.upper_bounds)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.upper_bounds, value)] += 1
        self.total += value

    def copy(self) -> Histogram:
        copy = Histogram(self.upper_bounds)
        copy.counts = list(self.counts)
        copy.total = self.total
        return copy

    def add(self, other: Histogram) -> None:
        """Adds the observations of ``other``, of the same buckets."""
        self.counts = [mine + theirs for mine, theirs in zip(self.counts, other.counts, strict=True)]
        self.total += other.total

    def cumulative(self) -> list[tuple[str, int]]:
        """[(le, cumulative count)], the form Prometheus exposes."""
        result, running = [], 0
        for bound, count in zip(self.upper_bounds, self.counts, strict=False):
            running += count
            result.append(("+Inf" if bound == float("inf") else repr(float(bound)), running))
        return result
