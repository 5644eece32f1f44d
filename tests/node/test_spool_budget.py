"""The spool's default budget: live runs are read first, and a stock Prometheus scrapes the worst a local user can lay
within its default timeout."""

from __future__ import annotations

import os
import time

import pytest

from neuron_exporter.config import Options, resolve_options
from neuron_exporter.node.node_view import NodeView
from neuron_exporter.node.spool_dir import Spool
from neuron_exporter.node.spool_format import RankMeta
from neuron_exporter.node.spool_reader import SpoolReader
from neuron_exporter.node.spool_writer import write_rank_file
from tests.support.daemon import Daemon
from tests.support.exposition import value
from tests.support.paths import RUN
from tests.support.processes import wait_until
from tests.support.prometheus import running_prometheus
from tests.support.rank_files import hostile_rank_file, rank_file, rank_file_bytes, steps_exposition
from tests.support.spool_writer import Writer


def test_a_live_run_is_read_before_finished_ones_whatever_its_id(tmp_path):
    for run in ("a-1", "a-2", "a-3"):  # ended an hour ago; their ids sort before the live run's
        for rank in "01":
            meta = RankMeta.current(rank, rank, run_id=run, finished=True)
            path = write_rank_file(tmp_path, meta, steps_exposition(rank).replace(RUN.encode(), run.encode()))
            then = time.time() - 3000 + int(run[-1])
            os.utime(path, (then, then))
    with Writer(tmp_path, "0,1"):  # the live run, "test-run"
        node = NodeView(resolve_options(env={}, overrides={"spool_dir": str(tmp_path), "spool_max_files": 4}))
        text = node.render().decode()
    assert value(text, "xla_steps_total", run_id=RUN, rank="0") == 5
    assert value(text, "xla_steps_total", run_id=RUN, rank="1") == 5
    assert value(text, "xla_steps_total", run_id="a-3", rank="1") == 7  # the most recent finished run next
    assert value(text, "xla_steps_total", run_id="a-1", rank="0") is None
    assert value(text, "neuron_exporter_spool_rejected_files", reason="over_budget") == 4


def test_files_that_lie_in_the_future_are_read_after_a_live_run(tmp_path):
    for run in ("a-1", "a-2"):  # ended before the clock was set back: their times lie a day ahead
        for rank in "01":
            meta = RankMeta.current(rank, rank, run_id=run, finished=True)
            path = write_rank_file(tmp_path, meta, steps_exposition(rank).replace(RUN.encode(), run.encode()))
            ahead = time.time() + 86400
            os.utime(path, (ahead, ahead))
    with Writer(tmp_path, "0,1"):  # the live run, "test-run"
        node = NodeView(resolve_options(env={}, overrides={"spool_dir": str(tmp_path), "spool_max_files": 2}))
        text = node.render().decode()
    assert value(text, "xla_steps_total", run_id=RUN, rank="0") == 5
    assert value(text, "xla_steps_total", run_id=RUN, rank="1") == 5
    assert value(text, "neuron_exporter_spool_rejected_files", reason="over_budget") == 4


def test_files_that_grow_after_a_refresh_are_read_within_the_budget(tmp_path, monkeypatch):
    for rank in "0123":
        rank_file(tmp_path, rank).write_bytes(rank_file_bytes(rank, steps_exposition(rank)))
    reader = SpoolReader(Spool(tmp_path), max_file_bytes=40_000, max_total_bytes=100_000, max_files=16)
    assert len(reader.refresh().reports) == 4
    for rank in "0123":  # each grows to 30 KB: three fit in the budget, not four
        rank_file(tmp_path, rank).write_bytes(hostile_rank_file(rank, 30_000))
    read = []
    real_read = reader._read
    monkeypatch.setattr(reader, "_read", lambda path, *args: read.append(path.name) or real_read(path, *args))
    reader.read_changed_files()
    assert len(read) == 3  # the background reader holds no more than a refresh would
    refresh = reader.refresh(read_changed=False)
    assert len(refresh.reports) == 3 and [reason.reason for _, reason in refresh.rejected] == ["over_budget"]
    assert refresh.rejected_counts["over_budget"] == 1


@pytest.mark.prometheus
def test_prometheus_scrapes_the_worst_spool_within_its_default_timeout(tmp_path, daemons):
    spool = tmp_path / "spool"
    spool.mkdir(mode=0o700)
    for rank in range(20):  # 80 MiB of valid short series, as many as files may hold
        rank_file(spool, str(rank)).write_bytes(hostile_rank_file(str(rank), Options().spool_max_file_bytes))
    daemon = Daemon(tmp_path, "--addr", "127.0.0.1", "--port", "0", "--spool-dir", str(spool))
    daemons(daemon)
    config = {
        "global": {"scrape_interval": "11s"},  # and Prometheus' default timeout, 10 s
        "scrape_configs": [
            {"job_name": "neuron-exporter", "static_configs": [{"targets": [f"127.0.0.1:{daemon.port}"]}]}
        ],
    }
    with running_prometheus(config, tmp_path) as prometheus:
        first = wait_until(lambda: prometheus.query("up")["data"]["result"], timeout=120, what="the first scrape")
        samples = prometheus.scalar("scrape_samples_scraped")
        duration = prometheus.scalar("scrape_duration_seconds")
    assert first[0]["value"][1] == "1", first  # the first, cold scrape: every file read and checked
    assert samples is not None and samples < 200_000  # the budget's worth (64 MiB let in 800,000)
    assert duration is not None and duration < 10
