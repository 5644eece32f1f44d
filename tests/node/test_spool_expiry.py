"""Whoever serves a spool removes what ended ranks left behind, once it is past the expiry, and nothing else."""

from __future__ import annotations

import os
import time

from neuron_exporter.config import resolve_options
from neuron_exporter.node import spool_expiry
from neuron_exporter.node.spool_dir import Spool
from neuron_exporter.node.spool_expiry import ExpiredFiles
from neuron_exporter.node.spool_format import RankMeta
from neuron_exporter.node.spool_writer import release_rank_lock, write_rank_file
from tests.support.daemon import Daemon
from tests.support.paths import RUN
from tests.support.processes import wait_until
from tests.support.rank_files import rank_file, steps_exposition
from tests.support.spool_writer import Writer


def age(path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then), follow_symlinks=False)


def names(directory) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def remove_expired_files(spool_dir, expire_after_seconds: float) -> int:
    return ExpiredFiles(Spool(spool_dir), expire_after_seconds).remove_files()


def remove_expired(options) -> int:
    return ExpiredFiles(Spool.of(options), options.expire_after_seconds).remove()


def files_of(ranks: str, *suffixes: str) -> list[str]:
    return [f"rank-{rank}.{RUN}{suffix}" for rank in ranks for suffix in suffixes]


def test_the_files_of_ended_ranks_past_the_expiry_are_removed_and_no_other(tmp_path):
    with Writer(tmp_path, "0,1") as live:
        with Writer(tmp_path, "2,3") as dead:
            dead.kill()
        with Writer(tmp_path, "4,5", "--finished"):  # its run ended cleanly; the process may live on
            pass
        for rank in "024":  # 0: alive but silent for long (the process may resume); 2: dead; 4: finished
            age(rank_file(tmp_path, rank), 7200)
        temporary = tmp_path / f".rank-6.{RUN}.prom.77.tmp"  # left by a writer killed mid-write
        temporary.write_bytes(b"half a file")
        age(temporary, 7200)
        orphan = rank_file(tmp_path, "7", suffix=".diagnosis.json")  # its rank file is gone
        orphan.write_bytes(b"{}")
        age(orphan, 7200)
        (tmp_path / "notes.txt").write_text("not the spool's")
        age(tmp_path / "notes.txt", 7200)

        assert remove_expired_files(tmp_path, 3600) == 2 + 2 + 2
        assert names(tmp_path) == sorted(
            ["notes.txt", *files_of("0135", ".lock", ".prom")]  # 5 finished, 3 died: not yet expired
        )
        assert remove_expired_files(tmp_path, 3600) == 0
        live.stop()


def test_a_rank_that_starts_again_as_its_old_files_expire_keeps_its_new_ones(tmp_path, monkeypatch):
    with Writer(tmp_path, "0", "--finished"):  # the first process of rank 0 ended long ago
        pass
    age(rank_file(tmp_path, "0"), 7200)
    read_header = spool_expiry.read_header

    def restarted_meanwhile(path, trusted=None):  # between the listing and the removal
        with Writer(tmp_path, "0", "--finished"):  # the same rank of the same run again (an elastic restart)
            pass
        return read_header(path, trusted)

    monkeypatch.setattr(spool_expiry, "read_header", restarted_meanwhile)
    assert remove_expired_files(tmp_path, 3600) == 0
    assert names(tmp_path) == files_of("0", ".lock", ".prom")


def test_an_expired_rank_without_a_lock_file_is_told_by_its_process(tmp_path):
    meta = RankMeta.current("0", "0")
    write_rank_file(tmp_path, meta, steps_exposition("0"))
    try:
        rank_file(tmp_path, "0", suffix=".lock").unlink()
        age(rank_file(tmp_path, "0"), 7200)
        assert remove_expired_files(tmp_path, 3600) == 0  # its process (this one) lives
    finally:
        release_rank_lock(tmp_path, "0")


def test_nothing_is_removed_from_a_directory_the_server_does_not_trust(tmp_path):
    spool = tmp_path / "spool"
    with Writer(spool, "0") as dead:
        dead.kill()
    age(rank_file(spool, "0"), 7200)
    spool.chmod(0o777)  # anyone could have laid what is in it
    options = resolve_options(env={}, overrides={"spool_dir": str(spool), "expire_after_seconds": 3600})
    assert remove_expired(options) == 0 and rank_file(spool, "0").exists()
    spool.chmod(0o700)
    assert remove_expired(options) == 2 and names(spool) == []
    assert remove_expired(resolve_options(env={}, overrides={"spool_dir": str(tmp_path / "missing")})) == 0


def test_the_daemon_removes_expired_files_without_being_scraped(tmp_path, daemons):
    spool = tmp_path / "spool"
    with Writer(spool, "0"), Writer(spool, "1,2", "--finished"):
        age(rank_file(spool, "1"), 7200)
        daemon = Daemon(
            tmp_path, "--addr", "127.0.0.1", "--port", "0", "--spool-dir", str(spool), "--expire-after-seconds", "3600"
        )
        daemons(daemon)
        wait_until(lambda: not rank_file(spool, "1").exists(), timeout=60, what="the expired files removed")
        assert names(spool) == files_of("02", ".lock", ".prom")
    assert daemon.stop() == 0


def test_files_that_lie_in_the_future_are_removed_once_they_stood_still_past_the_expiry(tmp_path, monkeypatch):
    # The clock was set back after this rank died and this writer was killed: their files' times lie a day ahead.
    monkeypatch.setattr(spool_expiry, "STALE_TEMP_SECONDS", 1.0)
    with Writer(tmp_path, "0") as live:
        with Writer(tmp_path, "1") as dead:
            dead.kill()
        temporary = tmp_path / f".rank-2.{RUN}.prom.77.tmp"
        temporary.write_bytes(b"half a file")
        for path in [temporary, *tmp_path.glob("rank-1.*")]:
            age(path, -86400)
        expired = ExpiredFiles(Spool(tmp_path), expire_after_seconds=1)
        assert expired.remove() == 0  # not yet: it may have been written just now
        wait_until(
            lambda: expired.remove() >= 0 and names(tmp_path) == files_of("0", ".lock", ".prom"),
            timeout=30,
            what="the dead rank's files and the temporary file removed",
        )
        live.stop()
