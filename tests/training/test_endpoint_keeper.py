"""The spool thread of a training process (``EndpointKeeper``): a failure in one turn is counted and the thread goes
on, or the rank would stop reporting and look dead; an endpoint process that fails to start is started again later,
one that served and ended (killed) at once."""

from __future__ import annotations

import logging
import os
import threading

import psutil
from prometheus_client import CollectorRegistry, Counter

from neuron_exporter.config import resolve_options
from neuron_exporter.training import endpoint_keeper
from neuron_exporter.training.endpoint_keeper import EndpointKeeper
from neuron_exporter.training.rank import rank_labels
from neuron_exporter.training.self_metrics import SelfStats
from tests.support.exposition import scrape, value
from tests.support.paths import ROOT
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

    def take_up_earlier(self) -> None:
        pass

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


class ServingRank:
    """A rank that has trained, on a port of its own (``port=0``)."""

    def __init__(self, spool_dir):
        self.options = resolve_options(
            env={},
            overrides={"port": 0, "addr": "127.0.0.1", "spool_dir": str(spool_dir), "spool_interval_seconds": 0.05},
        )
        self.auto, self.stats, self.claimed = False, SelfStats(), True

    def diagnosis(self) -> dict:
        return {}

    def _meta(self, finished: bool = False) -> dict:
        start = psutil.Process().create_time()
        return {**rank_labels(), "pid": os.getpid(), "start_time": start, "finished": finished, "last_step_time": None}

    def _write_spool(self, finished: bool = False) -> None:
        pass


def node_view_served(url: str) -> bool:
    """Whether the endpoint serves the node view (the endpoint process), not only this rank (the rank itself)."""
    try:
        text = scrape(url, timeout=5)
    except OSError:
        return False
    assert value(text, "xla_steps_total", **rank_labels()) == 3  # this rank, either way
    return value(text, "neuron_exporter_ranks") is not None


def endpoint_processes(killed: set[int]) -> list[psutil.Process]:
    return [p for p in psutil.Process().children() if "job_endpoint" in " ".join(p.cmdline()) and p.pid not in killed]


def kill_endpoint(killed: set[int], served: bool, url: str) -> None:
    """SIGKILL the endpoint process that runs now, once it has served a scrape or at once."""
    (endpoint,) = wait_until(lambda: endpoint_processes(killed), what="an endpoint process")
    if served:
        wait_until(lambda: node_view_served(url), what="the node view served")
    endpoint.kill()
    endpoint.wait(30)
    killed.add(endpoint.pid)


def keeper_of(tmp_path) -> tuple[ServingRank, EndpointKeeper, str]:
    registry = CollectorRegistry()
    Counter("xla_steps", "Steps ended", list(rank_labels()), registry=registry).labels(**rank_labels()).inc(3)
    rank = ServingRank(tmp_path)
    keeper = EndpointKeeper(rank, registry, None)
    keeper.serve(first_try=True)
    keeper.start_spool_thread()
    assert keeper.url is not None
    return rank, keeper, keeper.url


def test_endpoints_killed_after_they_served_never_leave_the_rank_serving_itself(tmp_path, caplog):
    rank, keeper, url = keeper_of(tmp_path)
    killed: set[int] = set()
    try:
        with caplog.at_level(logging.WARNING, logger="neuron_exporter"):
            for _ in range(endpoint_keeper.ENDPOINT_MAX_FAILURES + 1):
                kill_endpoint(killed, served=True, url=url)
            wait_until(lambda: node_view_served(url), what="the node view served again")
    finally:
        keeper.stop_spool_thread()
        keeper.close()
    assert "own rank only" not in caplog.text and rank.stats.errors.get("scrape", 0) == 0


def test_an_endpoint_that_keeps_failing_to_start_is_started_again_later_and_later(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(endpoint_keeper, "ENDPOINT_RETRY_SECONDS", 2.0)
    rank, keeper, url = keeper_of(tmp_path)
    killed: set[int] = set()
    try:
        with caplog.at_level(logging.WARNING, logger="neuron_exporter"):
            for _ in range(endpoint_keeper.ENDPOINT_MAX_FAILURES):  # each before it served: it failed to start
                kill_endpoint(killed, served=False, url=url)
            wait_until(lambda: "starts it again in 2s" in caplog.text, what="the job to fall back to its own rank")
            # Its own rank, on the same port, for a while (the URL was printed or registered).
            wait_until(lambda: keeper.url == url and node_view_served(url) is False, what="its own rank served")
            kill_endpoint(killed, served=False, url=url)  # started again, and fails again: it waits twice as long
            wait_until(lambda: "starts it again in 4s" in caplog.text, what="a longer wait")
            wait_until(lambda: node_view_served(url), what="the endpoint process started again")
            kill_endpoint(killed, served=True, url=url)  # it served: no failure, and the count starts over
            wait_until(lambda: node_view_served(url), what="the endpoint process started again")
    finally:
        keeper.stop_spool_thread()
        keeper.close()
    assert rank.stats.errors["scrape"] == endpoint_keeper.ENDPOINT_MAX_FAILURES + 1
    assert keeper._endpoint_failures == 0 and keeper._retry_after == 2.0


def test_the_port_option_is_read_once_by_one_rule():
    """`port` is the node's shared endpoint, or (0) a port of the job's own: the keeper reads it once and hands each
    part of the code what it means (a port to bind, whether to serve every run); nothing reads it again."""
    package = ROOT / "neuron_exporter"
    readers = {
        path.relative_to(package).as_posix(): path.read_text().count("options.port")
        for path in [*(package / "training").rglob("*.py"), package / "node" / "job_link.py"]
    }
    assert {path: count for path, count in readers.items() if count} == {"training/endpoint_keeper.py": 1}
