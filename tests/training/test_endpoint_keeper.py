"""The spool thread of a training process (``EndpointKeeper``): a failure in one turn is counted and the thread goes
on, or the rank would stop reporting and look dead."""

from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry

from neuron_exporter.config import resolve_options
from neuron_exporter.training.endpoint_keeper import EndpointKeeper
from neuron_exporter.training.self_metrics import SelfStats
from tests.support.processes import wait_until


class Rank:
    """A rank whose first spool writes fail."""

    def __init__(self, failures: int):
        self.options = resolve_options(overrides={"spool_interval_seconds": 0.01, "port": 0})
        self.auto, self.stats, self.claimed = True, SelfStats(), False
        self.failures, self.writes = failures, 0
        self.lock = threading.Lock()

    def diagnosis(self) -> dict:
        return {}

    def _meta(self, finished: bool = False) -> dict:
        return {}

    def _write_spool(self, finished: bool = False) -> None:
        with self.lock:
            self.writes += 1
            if self.writes <= self.failures:
                raise RuntimeError("can't start new thread")


def test_the_spool_thread_outlives_a_failing_turn_and_counts_it():
    rank = Rank(failures=3)
    keeper = EndpointKeeper(rank, CollectorRegistry(), None)
    keeper.start_spool_thread()
    try:
        wait_until(lambda: rank.writes >= 6, timeout=30, what="spool writes after the failures")
    finally:
        keeper.stop_spool_thread()
    assert rank.stats.errors["spool"] == 3
