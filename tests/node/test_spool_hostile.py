"""The spool trusts nothing it finds: links, FIFOs, huge or forged files, other users' directories and files,
deletion."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

from neuron_exporter.config import ConfigError, Options, resolve_options
from neuron_exporter.node import spool_dir, spool_expiry
from neuron_exporter.node.node_view import NodeView
from neuron_exporter.node.spool_dir import SpoolDirError, prepare_spool_dir
from neuron_exporter.node.spool_format import RankMeta, RejectedFile
from neuron_exporter.node.spool_listing import MAX_NAMED_REJECTIONS
from neuron_exporter.node.spool_reader import read_rank_file, writer_alive
from neuron_exporter.node.spool_writer import SpoolBusyError, release_rank_lock, write_rank_file
from tests.support.daemon import Daemon, serve_command
from tests.support.exposition import samples, scrape, total, value
from tests.support.fuzz import cases
from tests.support.paths import RUN, SCRIPTS
from tests.support.processes import TrainingRun, wait_until, xla_env
from tests.support.rank_files import hostile_rank_file, rank_file, rank_file_bytes, steps_exposition
from tests.support.spool_writer import Writer

NOBODY = 65534
OTHER = 65533  # a second local user


def test_the_spool_modes_are_the_options_modes():
    for mode in spool_dir.SPOOL_MODES:
        assert resolve_options(env={"NEURON_EXPORTER_SPOOL_MODE": mode}).spool_mode == mode
    with pytest.raises(ConfigError, match=rf"is not a spool mode \({', '.join(spool_dir.SPOOL_MODES)}\)$"):
        resolve_options(env={"NEURON_EXPORTER_SPOOL_MODE": "open"})


def test_laid_links_are_never_followed_by_the_writer(tmp_path):
    directory = tmp_path / "spool"
    directory.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    victim.chmod(0o600)
    # Every name a writer used to use, and the rank file itself, point at the victim.
    (directory / f".rank-0.{RUN}.prom.{os.getpid()}.tmp").symlink_to(victim)
    rank_file(directory, "0").symlink_to(victim)
    try:
        write_rank_file(directory, RankMeta.current("0", "0"), steps_exposition("0"))
        assert victim.read_text() == "precious\n" and (victim.stat().st_mode & 0o777) == 0o600
        assert not rank_file(directory, "0").is_symlink()
        assert read_rank_file(rank_file(directory, "0")).meta.pid == os.getpid()
        assert rank_file(directory, "0").stat().st_mode & 0o777 == 0o600
    finally:
        release_rank_lock(directory, "0")


def test_a_laid_lock_link_is_refused(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    directory = tmp_path / "spool"
    directory.mkdir(mode=0o700)
    rank_file(directory, "0", suffix=".lock").symlink_to(victim)
    with pytest.raises(OSError):
        write_rank_file(directory, RankMeta.current("0", "0"), steps_exposition("0"))
    assert victim.read_text() == "precious\n"


@pytest.mark.parametrize("mode, message", [(0o777, "writable by everyone"), (0o770, "writable by its group")])
def test_a_directory_others_can_write_is_refused(tmp_path, mode, message):
    directory = tmp_path / "spool"
    directory.mkdir()
    directory.chmod(mode)
    with pytest.raises(SpoolDirError, match=message):
        write_rank_file(directory, RankMeta.current("0", "0"), steps_exposition("0"))
    assert os.listdir(directory) == []


def test_another_users_directory_is_refused(tmp_path):
    directory = tmp_path / "spool"
    directory.mkdir(mode=0o700)
    os.chown(directory, NOBODY, NOBODY)
    with pytest.raises(SpoolDirError, match=f"belongs to uid {NOBODY}"):
        write_rank_file(directory, RankMeta.current("0", "0"), steps_exposition("0"))


def test_a_link_as_the_directory_is_refused(tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(SpoolDirError, match="symbolic link"):
        write_rank_file(tmp_path / "link", RankMeta.current("0", "0"), steps_exposition("0"))


def test_a_shared_mode_accepts_a_sticky_directory(tmp_path):
    directory = tmp_path / "shared"
    spool_dir.prepare_spool_dir(directory, "shared")
    assert directory.stat().st_mode & 0o7777 == 0o1777
    try:
        path = write_rank_file(directory, RankMeta.current("0", "0"), steps_exposition("0"), "shared")
        assert path.stat().st_mode & 0o777 == 0o644
    finally:
        release_rank_lock(directory, "0")


def test_a_deleted_directory_is_made_again_and_the_rank_keeps_its_lock(tmp_path):
    directory = tmp_path / "spool"
    with Writer(directory, "0", "--rewrite", "0.05") as writer:
        shutil.rmtree(directory)
        wait_until(
            lambda: rank_file(directory, "0").exists() and rank_file(directory, "0", suffix=".lock").exists(),
            what="the rank file to be written again",
        )
        report = wait_until(lambda: _readable(rank_file(directory, "0")), what="a whole rank file")
        assert report.meta.pid == writer.pid
        assert writer_alive(report) is True  # the lock was taken again on the new lock file
        with pytest.raises(SpoolBusyError):
            write_rank_file(directory, RankMeta.current("0", "0"), steps_exposition("0"))


def _readable(path):
    try:
        return read_rank_file(path)
    except (OSError, RejectedFile):
        return None


def test_stale_temporary_files_are_removed(tmp_path):
    directory = tmp_path / "spool"
    directory.mkdir(mode=0o700)
    stale, fresh = directory / f".rank-5.{RUN}.prom.77.tmp", directory / f".rank-6.{RUN}.prom.abc.tmp"
    stale.write_bytes(b"half a file")
    fresh.write_bytes(b"being written")
    then = time.time() - 2 * spool_expiry.STALE_TEMP_SECONDS
    os.utime(stale, (then, then))
    try:
        write_rank_file(directory, RankMeta.current("0", "0"), steps_exposition("0"))
        assert not stale.exists() and fresh.exists()
    finally:
        release_rank_lock(directory, "0")


# -- the node endpoint over a spool directory with hostile files -----------------------------------------------

HOSTILE = {
    f"rank-2.{RUN}.prom": ("not_regular", lambda path: path.symlink_to("/dev/zero")),
    f"rank-3.{RUN}.prom": ("not_regular", lambda path: os.mkfifo(path)),
    f"rank-4.{RUN}.prom": (
        "too_large",
        lambda path: path.write_bytes(
            rank_file_bytes("4", steps_exposition("4")) + b"# " + b"x" * (5 * 1024 * 1024) + b"\n"
        ),
    ),
    f"rank-5.{RUN}.prom": (
        "bad_header",
        lambda path: path.write_bytes(rank_file_bytes("5", steps_exposition("5"), pid=1e400)),
    ),
    f"rank-6.{RUN}.prom": (
        "bad_exposition",
        lambda path: path.write_bytes(
            rank_file_bytes("6", steps_exposition("6") + b'xla_steps_total{rank="6"} not-a-number\n')
        ),
    ),
    f"rank-7.{RUN}.prom": (
        "bad_exposition",
        lambda path: path.write_bytes(
            rank_file_bytes(
                "7",
                steps_exposition("0", "neuron_exporter_rank_up", f'local_rank="0",rank="0",run_id="{RUN}"').replace(
                    b"counter", b"gauge"
                ),
            )
        ),
    ),
    f"rank-8.{RUN}.prom": (
        "bad_exposition",
        lambda path: path.write_bytes(rank_file_bytes("8", steps_exposition("0"))),
    ),
    f"rank-9.{RUN}.prom": ("wrong_rank", lambda path: path.write_bytes(rank_file_bytes("0", steps_exposition("0")))),
    f"rank-10.{RUN}.prom": ("bad_header", lambda path: path.write_bytes(b"[" * 3000 + b"\n")),
    # A sample timestamp (Prometheus drops samples out of bounds), a family named like a histogram's count (a second
    # HELP line for the histogram once the ranks are merged): either would spoil the whole node's scrape.
    f"rank-11.{RUN}.prom": (
        "bad_exposition",
        lambda path: path.write_bytes(rank_file_bytes("11", steps_exposition("11").replace(b" 7.0\n", b" 7.0 1000\n"))),
    ),
    f"rank-12.{RUN}.prom": (
        "bad_exposition",
        lambda path: path.write_bytes(rank_file_bytes("12", steps_exposition("12", "xla_step_duration_seconds_count"))),
    ),
}


def lay_hostile_files(directory) -> None:
    for name, (_, make) in HOSTILE.items():
        make(directory / name)


def test_the_daemon_serves_every_good_rank_and_counts_the_bad_files(tmp_path, daemons):
    directory = tmp_path / "spool"
    with Writer(directory, "0,1", "--steps", "4"):
        lay_hostile_files(directory)
        daemon = Daemon(tmp_path, "--addr", "127.0.0.1", "--port", "0", "--spool-dir", str(directory))
        daemons(daemon)
        with urllib.request.urlopen(daemon.url, timeout=2) as response:  # a FIFO or /dev/zero must not stall it
            text = response.read().decode()
        ranks = {dict(labels).get("rank") for (name, labels) in samples(text) if name == "xla_steps_total"}
        assert ranks == {"0", "1"}
        assert value(text, "xla_steps_total", rank="0") == 4  # rank 8's forged series for rank 0 is not added
        assert value(text, "neuron_exporter_rank_up", rank="0") == 1  # the forged rank_up 0 is not served
        assert value(text, "neuron_exporter_ranks") == 2
        expected = {}
        for reason, _ in HOSTILE.values():
            expected[reason] = expected.get(reason, 0) + 1
        for reason, count in expected.items():
            assert value(text, "neuron_exporter_spool_rejected_files", reason=reason) == count, reason
        check = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
        assert check.returncode == 0 and check.stdout + check.stderr == "", check.stdout + check.stderr
    log = daemon.log.read_text()
    assert "Traceback" not in log
    assert log.count(f"rank-3.{RUN}.prom") == 1  # one line for each bad file, however often it is scraped


def test_a_training_jobs_node_endpoint_is_not_slowed_or_fed_by_bad_files(tmp_path):
    directory = tmp_path / "spool"
    directory.mkdir(mode=0o700)
    lay_hostile_files(directory)
    env = xla_env(TEST_SPOOL_DIR=str(directory), NEURON_EXPORTER_RUN_ID=RUN)  # the hostile files are of its run
    with TrainingRun("train_scenario.py", "clean", "3", env=env) as run:
        url = run.result()["url"]
        with urllib.request.urlopen(url, timeout=2) as response:
            text = response.read().decode()
        assert {dict(labels).get("rank") for (name, labels) in samples(text) if name == "xla_steps_total"} == {"0"}
        assert value(text, "neuron_exporter_spool_rejected_files", reason="not_regular") == 2
        assert psutil.Process(run.process.pid).memory_info().rss < 2 * 1024**3  # /dev/zero was never read
        code, stderr = run.finish()
    assert code == 0 and "Traceback" not in stderr


def test_a_training_jobs_node_endpoint_never_opens_another_runs_files(tmp_path):
    directory = tmp_path / "spool"
    directory.mkdir(mode=0o700)
    lay_hostile_files(directory)  # of the run "test-run"; the training script has a run of its own
    with TrainingRun("train_scenario.py", "clean", "3", env=xla_env(TEST_SPOOL_DIR=str(directory))) as run:
        text = scrape(run.result()["url"])
        assert {dict(labels).get("rank") for (name, labels) in samples(text) if name == "xla_steps_total"} == {"0"}
        assert total(text, "neuron_exporter_spool_rejected_files") == 0  # not even opened, so not judged
        code, stderr = run.finish()
    assert code == 0 and "not serving from the spool directory" not in stderr


def test_a_rank_refuses_another_users_directory_in_one_line(tmp_path):
    directory = tmp_path / "theirs"
    directory.mkdir(mode=0o700)
    os.chown(directory, NOBODY, NOBODY)
    env = xla_env(TEST_SPOOL_DIR=str(directory), NEURON_EXPORTER_SPOOL_INTERVAL_SECONDS="0.05")
    with TrainingRun("train_scenario.py", "clean", "3", env=env) as run:
        url = run.result()["url"]
        wait_until(
            lambda: (value(scrape(url), "neuron_exporter_collection_errors_total", stage="spool") or 0) >= 3,
            what="several refused spool writes",
        )
        code, stderr = run.finish()
    assert code == 0
    # one line from the writer, and one from the job's node endpoint, which will not read it either
    assert stderr.count(f"belongs to uid {NOBODY}, not to this user") == 1 and "Traceback" not in stderr
    assert stderr.count(f"belongs to uid {NOBODY}, whom this reader does not trust") == 1
    assert os.listdir(directory) == []


# -- fuzz ----------------------------------------------------------------------------------------------------


def test_fuzz_the_spool_reader(tmp_path):
    sys.path.insert(0, str(SCRIPTS))
    from spool_writer import rank_exposition

    seeds = [rank_file_bytes("0", steps_exposition("0")), rank_file_bytes("0", rank_exposition("0", steps=5, ops=3))]
    path = rank_file(tmp_path, "0")
    for case, data in cases(seeds, "spool"):
        path.write_bytes(data)
        try:
            report = read_rank_file(path)
        except RejectedFile:
            continue
        except Exception as error:  # noqa: BLE001
            pytest.fail(f"case {case}: {type(error).__name__}: {error}")
        assert (report.meta.rank, report.meta.run_id) == ("0", RUN), case


# -- another user's directory or files, on the reading side ----------------------------------------------------


@contextlib.contextmanager
def another_user(work, uid: int = NOBODY):
    """A child process that becomes ``uid`` (and its group), runs ``work()``, then holds on (its locks too) until the
    block ends."""
    ready_r, ready_w = os.pipe()
    release_r, release_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setgid(uid)
            os.setuid(uid)
            work()
            os.write(ready_w, b"1")
            os.read(release_r, 1)
            code = 0
        finally:
            os._exit(code)
    os.close(ready_w)
    os.close(release_r)
    try:
        assert os.read(ready_r, 1) == b"1", f"the child could not do its work as uid {uid}"
        yield pid
    finally:
        os.close(ready_r)
        with contextlib.suppress(BrokenPipeError):  # the child failed, and is gone
            os.write(release_w, b"x")
        os.close(release_w)
        os.waitpid(pid, 0)


def test_a_spool_directory_squatted_by_another_user_is_not_served(tmp_path, daemons):
    base = Path(tempfile.mkdtemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    base.chmod(0o1777)  # like /dev/shm: anyone may create the default directory before the job does
    spool = base / "neuron-exporter"
    forged = steps_exposition("0").replace(b" 7.0\n", b" 1e+15\n")
    try:
        with another_user(lambda: write_rank_file(spool, RankMeta.current("0", "0"), forged)):
            assert spool.stat().st_uid == NOBODY and rank_file(spool, "0").stat().st_uid == NOBODY
            # The daemon started after the squat stays up, serves no rank from it and says why, once.
            daemon = Daemon(tmp_path, *serve_command(spool)[4:])
            daemons(daemon)
            for _ in range(2):
                text = scrape(daemon.url)
                assert value(text, "neuron_exporter_spool_directory_ok") == 0 and value(text, "xla_steps_total") is None
            refused = [line for line in daemon.log.read_text().splitlines() if "belongs to uid" in line]
            assert len(refused) == 1 and f"belongs to uid {NOBODY}, whom this reader" in refused[0]
            assert daemon.stop() == 0
            trusting = NodeView(
                resolve_options(env={}, overrides={"spool_dir": str(spool), "spool_trusted_users": str(NOBODY)})
            )
            text = trusting.render().decode()  # configured to trust that user: its rank is served
            assert value(text, "xla_steps_total", rank="0") == 1e15
            assert value(text, "neuron_exporter_rank_up", rank="0") == 1
    finally:
        shutil.rmtree(base)


def test_a_file_of_another_user_in_a_trusted_directory_is_not_served(tmp_path):
    spool = tmp_path / "spool"
    try:
        write_rank_file(spool, RankMeta.current("0", "0"), steps_exposition("0"), "readable")
        write_rank_file(spool, RankMeta.current("1", "1"), steps_exposition("1"), "readable")
        os.chown(rank_file(spool, "1"), NOBODY, NOBODY)  # as if another user had put it there
        text = (
            NodeView(resolve_options(env={}, overrides={"spool_dir": str(spool), "spool_mode": "readable"}))
            .render()
            .decode()
        )
    finally:
        release_rank_lock(spool, "0")
        release_rank_lock(spool, "1")
    assert value(text, "xla_steps_total", rank="0") == 7 and value(text, "xla_steps_total", rank="1") is None
    assert value(text, "neuron_exporter_spool_rejected_files", reason="untrusted_owner") == 1


def test_an_unknown_trusted_user_is_one_line_and_exit_2(tmp_path):
    served = subprocess.run(
        [
            sys.executable,
            "-m",
            "neuron_exporter",
            "serve",
            "--port",
            "0",
            "--spool-dir",
            str(tmp_path),
            "--spool-trusted-users",
            "root,no-such-user-here",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert served.returncode == 2 and served.stderr.count("\n") == 1
    assert "--spool-trusted-users" in served.stderr and "no user called" in served.stderr


# -- what other local users lay in a shared spool --------------------------------------------------------------


@pytest.fixture
def shared_spool():
    """A spool directory in the ``shared`` mode (root's, sticky, anyone writes) where other users can reach it."""
    base = Path(tempfile.mkdtemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    base.chmod(0o755)  # tmp_path's parents are root's alone
    spool = base / "spool"
    prepare_spool_dir(spool, "shared")
    yield spool
    shutil.rmtree(base)


def shared_view(spool, **options) -> NodeView:
    return NodeView(resolve_options(env={}, overrides={"spool_dir": str(spool), "spool_mode": "shared", **options}))


def steps_of(rank: str, run: str) -> bytes:
    return steps_exposition(rank, labels=f'local_rank="{rank}",rank="{rank}",run_id="{run}"')


def lay_rank_files(spool, runs, **header) -> None:
    """Valid rank files of rank 0 of ``runs``, fresh, without a lock: what any local user can lay."""
    for run in runs:
        (spool / f"rank-0.{run}.prom").write_bytes(rank_file_bytes("0", steps_of("0", run), run_id=run, **header))


def test_empty_files_another_user_lays_hide_no_rank(shared_spool):
    write_rank_file(shared_spool, RankMeta.current("0", "0"), steps_exposition("0"), "shared")

    def lay():  # 1024 empty files, as many as spool_max_files
        for i in range(1024):
            os.close(os.open(shared_spool / f"rank-{i}.%25.prom", os.O_CREAT | os.O_WRONLY, 0o644))

    try:
        with another_user(lay):
            view = shared_view(shared_spool)
            text = view.render().decode()
    finally:
        release_rank_lock(shared_spool, "0")
    assert value(text, "xla_steps_total", rank="0") == 7 and value(text, "neuron_exporter_ranks") == 1
    assert value(text, "neuron_exporter_spool_rejected_files", reason="bad_header") == 1024
    assert value(text, "neuron_exporter_spool_rejected_files", reason="over_budget") == 0
    assert len(view.rejected) == MAX_NAMED_REJECTIONS  # every file counted, a bounded number of them named


def test_the_largest_files_another_user_lays_hide_no_rank(shared_spool):
    write_rank_file(shared_spool, RankMeta.current("0", "0"), steps_exposition("0"), "shared")
    size = Options().spool_max_file_bytes

    def lay():  # three valid files as large as a file may be, fresh, of runs whose ids sort before the real one's
        for k in range(3):
            run = f"0attack{k}"  # as long as RUN
            data = hostile_rank_file("0", size).replace(RUN.encode(), run.encode())
            (shared_spool / f"rank-0.{run}.prom").write_bytes(data.replace(b" Every", b" " * (size - len(data)), 1))

    try:
        with another_user(lay):
            text = shared_view(shared_spool).render().decode()
    finally:
        release_rank_lock(shared_spool, "0")
    assert value(text, "xla_steps_total", run_id=RUN, rank="0") == 7
    assert value(text, "neuron_exporter_spool_rejected_files", reason="over_budget") == 1  # one of the three


def test_another_users_live_rank_is_read_before_the_files_a_third_user_lays(shared_spool):
    ranked = RankMeta.current("0", "0", run_id="their-run")
    with another_user(lambda: write_rank_file(shared_spool, ranked, steps_of("0", "their-run"), "shared"), OTHER):
        with another_user(lambda: lay_rank_files(shared_spool, [f"0laid{k}" for k in range(20)])):
            text = shared_view(shared_spool, spool_max_files=2).render().decode()
    assert value(text, "xla_steps_total", run_id="their-run", rank="0") == 7
    assert value(text, "neuron_exporter_rank_up", run_id="their-run", rank="0") == 1
    assert value(text, "neuron_exporter_spool_rejected_files", reason="over_budget") == 19


def test_other_users_take_turns_in_the_budget(shared_spool):
    with another_user(lambda: lay_rank_files(shared_spool, ["their-run", "their-other-run"], finished=True), OTHER):
        with another_user(lambda: lay_rank_files(shared_spool, [f"0laid{k}" for k in range(20)], finished=True)):
            text = shared_view(shared_spool, spool_max_files=4).render().decode()
    assert value(text, "xla_steps_total", run_id="their-run", rank="0") == 7
    assert value(text, "xla_steps_total", run_id="their-other-run", rank="0") == 7
    assert value(text, "neuron_exporter_ranks") == 4


def test_at_most_four_files_a_served_one_are_looked_at(shared_spool):
    write_rank_file(shared_spool, RankMeta.current("0", "0"), steps_exposition("0"), "shared")

    def lay():
        for i in range(200):
            os.close(os.open(shared_spool / f"rank-{i}.%25.prom", os.O_CREAT | os.O_WRONLY, 0o644))

    try:
        with another_user(lay):
            text = shared_view(shared_spool, spool_max_files=4).render().decode()
    finally:
        release_rank_lock(shared_spool, "0")
    assert value(text, "xla_steps_total", rank="0") == 7
    assert value(text, "neuron_exporter_spool_rejected_files", reason="bad_header") == 15  # opened, with rank 0
    assert value(text, "neuron_exporter_spool_rejected_files", reason="over_budget") == 185  # never opened
