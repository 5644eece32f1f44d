"""The spool protocol: atomic rank files, liveness through the rank lock (expiry: test_spool_expiry)."""

from __future__ import annotations

import os
import time

import psutil
import pytest

from neuron_exporter.node.spool_dir import Spool
from neuron_exporter.node.spool_format import RankMeta
from neuron_exporter.node.spool_reader import SpoolReader, read_rank_file, writer_alive
from neuron_exporter.node.spool_writer import SpoolBusyError, release_rank_lock, write_rank_file
from tests.support.paths import ROOT, RUN
from tests.support.rank_files import rank_file
from tests.support.spool_writer import Writer


def exposition(rank: str = "0", steps: str = "3.0") -> bytes:
    return (
        b"# HELP xla_steps_total Steps\n# TYPE xla_steps_total counter\n"
        b'xla_steps_total{local_rank="%s",rank="%s",run_id="%s"} %s\n'
        % (rank.encode(), rank.encode(), RUN.encode(), steps.encode())
    )


EXPOSITION = exposition()


def read_spool(directory) -> list:
    return (
        SpoolReader(Spool(directory), max_file_bytes=1 << 20, max_total_bytes=1 << 24, max_files=100).refresh().reports
    )


def test_round_trip_keeps_meta_and_exposition_bytes(tmp_path):
    meta = RankMeta.current("3", "3", last_step_time=1234.5)
    path = write_rank_file(tmp_path / "spool", meta, exposition("3"))
    try:
        assert path.name == f"rank-3.{RUN}.prom"
        report = read_rank_file(path)
        assert report.meta == meta
        assert report.exposition == exposition("3")
        assert abs(report.mtime - time.time()) < 60
        assert [p.name for p in (tmp_path / "spool").iterdir() if p.name.endswith(".tmp")] == []
    finally:
        release_rank_lock(tmp_path / "spool", "3")


def test_meta_may_be_a_mapping(tmp_path):
    meta = {
        "rank": "2",
        "local_rank": "2",
        "pid": os.getpid(),
        "start_time": psutil.Process().create_time(),
        "finished": True,
        "other": "ignored",
    }
    write_rank_file(tmp_path, meta, exposition("2"))
    report = read_rank_file(rank_file(tmp_path, "2"))
    assert report.meta.finished is True and report.meta.rank == "2" and report.meta.last_step_time is None


def test_rewrite_replaces_the_file_atomically(tmp_path):
    meta = RankMeta.current("0", "0")
    try:
        first = write_rank_file(tmp_path, meta, EXPOSITION)
        inode = first.stat().st_ino
        write_rank_file(tmp_path, meta, exposition(steps="4.0"))
        assert first.stat().st_ino != inode  # a new file renamed over the old one, never rewritten in place
        assert read_rank_file(first).exposition.endswith(b"4.0\n")
    finally:
        release_rank_lock(tmp_path, "0")


def test_read_orders_ranks_numerically_and_ignores_other_files(tmp_path):
    with Writer(tmp_path, "10,2,1"):
        rank_file(tmp_path, "9").write_bytes(b"not json\n")
        rank_file(tmp_path, "8").write_bytes(b'{"format": 99}\n')
        (tmp_path / "notes.txt").write_text("x")
        (tmp_path / f".rank-1.{RUN}.prom.123.tmp").write_text("half a file")
        assert [r.meta.rank for r in read_spool(tmp_path)] == ["1", "2", "10"]
    assert read_spool(tmp_path / "missing") == []


def test_a_live_writer_is_alive_and_a_killed_one_is_dead(tmp_path):
    writer = Writer(tmp_path, "0")
    report = read_rank_file(rank_file(tmp_path, "0"))
    assert report.meta.pid == writer.pid
    assert writer_alive(report) is True
    assert writer_alive(report) is True  # probing does not take the lock away from the writer
    writer.kill()
    assert writer_alive(report) is False


def test_a_second_live_process_cannot_take_a_rank(tmp_path):
    with Writer(tmp_path, "0") as first:
        with pytest.raises(SpoolBusyError, match="rank 0"):
            write_rank_file(tmp_path, RankMeta.current("0", "0"), EXPOSITION)
        assert read_rank_file(rank_file(tmp_path, "0")).meta.pid == first.pid
        first.kill()
    # once the first process is gone, a new process with the same rank replaces its file
    write_rank_file(tmp_path, RankMeta.current("0", "0"), EXPOSITION)
    try:
        assert read_rank_file(rank_file(tmp_path, "0")).meta.pid == os.getpid()
    finally:
        release_rank_lock(tmp_path, "0")


def test_a_finished_report_releases_the_rank(tmp_path):
    with Writer(tmp_path, "0", "--finished") as writer:
        report = read_rank_file(rank_file(tmp_path, "0"))
        assert report.meta.finished
        assert writer_alive(report) is False  # the process lives on, but no longer as a rank
        write_rank_file(tmp_path, RankMeta.current("0", "0"), EXPOSITION)  # so a new rank 0 may start
        release_rank_lock(tmp_path, "0")
        writer.stop()


def test_without_a_lock_file_the_pid_and_its_start_time_decide(tmp_path):
    me = psutil.Process()
    rank_file(tmp_path, "0").write_bytes(
        b'{"format":2,"run_id":"test-run","rank":"0","local_rank":"0","pid":%d,"start_time":%f}\n'
        % (me.pid, me.create_time())
    )
    reused = me.create_time() - 3600  # same pid, but the file was written by an earlier process
    rank_file(tmp_path, "1").write_bytes(
        b'{"format":2,"run_id":"test-run","rank":"1","local_rank":"1","pid":%d,"start_time":%f}\n' % (me.pid, reused)
    )
    gone = psutil.Popen(["true"])
    gone.wait()
    rank_file(tmp_path, "2").write_bytes(
        b'{"format":2,"run_id":"test-run","rank":"2","local_rank":"2","pid":%d,"start_time":1.0}\n' % gone.pid
    )
    alive = {r.meta.rank: writer_alive(r) for r in read_spool(tmp_path)}
    assert alive == {"0": True, "1": False, "2": False}


def test_whom_a_reader_trusts_is_worked_out_in_one_place():
    """The daemon, `run` and a job's endpoint build one Spool from the options and hand it down: nothing that reads,
    serves or tidies the spool works out its trust again, and the reader hands its findings back, not as attributes
    set on the side."""
    node = ROOT / "neuron_exporter" / "node"
    sources = {path.name: path.read_text() for path in node.glob("*.py")}
    needles = ("trusted_owners(", "file_trust(", "check_spool_dir(", "def prepare_spool")
    for needle in (*needles, "options.spool_dir", "options.spool_mode", "options.spool_trusted_users"):
        assert {name for name, source in sources.items() if needle in source} <= {"spool_dir.py"}, needle
    reader = sources["spool_reader.py"]
    assert "self.over_budget" not in reader and "self.rejected_counts" not in reader and "self.diagnoses" not in reader
