"""attach() anywhere in a script that trains in processes started by a launcher: the endpoint shows the process
that trains, a clean end is finished and a kill is dead."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from neuron_exporter.config import Options
from neuron_exporter.node.node_view import NodeView
from neuron_exporter.node.spool_reader import read_rank_file
from tests.support.daemon import free_port
from tests.support.exposition import scrape, value
from tests.support.paths import SCRIPTS
from tests.support.processes import wait_until, xla_env
from tests.support.rank_files import only_rank_file

pytestmark = pytest.mark.training

STEPS = 5


def launch(tmp_path, placement: str, start_method: str):
    spool, port = tmp_path / "spool", free_port()
    env = xla_env(
        NEURON_EXPORTER_PORT=str(port),
        NEURON_EXPORTER_ADDR="127.0.0.1",
        NEURON_EXPORTER_SPOOL_DIR=str(spool),
        NEURON_EXPORTER_SPOOL_INTERVAL_SECONDS="0.1",
    )
    process = subprocess.Popen(
        [sys.executable, str(SCRIPTS / "launched.py"), placement, start_method, str(STEPS), str(tmp_path)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return process, spool, f"http://127.0.0.1:{port}/metrics"


def trained_pid(tmp_path) -> int:
    found = wait_until(lambda: list(tmp_path.glob("trained-*")) or None, timeout=240, what="the training process")
    return int(found[0].name.split("-")[1])


def node_state(spool) -> str | None:
    view = NodeView(Options(spool_dir=str(spool)))
    (status,) = view.statuses()
    return status.state


def shown_steps(url) -> float | None:
    try:
        return value(scrape(url), "xla_steps_total", rank="0")
    except OSError:
        return None


@pytest.mark.parametrize("start_method", ["spawn", "fork"])
@pytest.mark.parametrize("placement", ["top", "mp_fn", "main"])
def test_the_process_that_trains_is_shown_and_ends_finished(tmp_path, placement, start_method):
    process, spool, url = launch(tmp_path, placement, start_method)
    try:
        pid = trained_pid(tmp_path)
        assert pid != process.pid  # a worker trained, not the launcher
        wait_until(lambda: shown_steps(url) == STEPS, timeout=60, what=f"{STEPS} steps on the endpoint")
        assert value(scrape(url), "neuron_exporter_rank_up", rank="0") == 1
        (tmp_path / "go").write_text("")
        _, stderr = process.communicate(timeout=120)
    finally:
        process.kill()
    assert process.returncode == 0, stderr[-3000:]
    assert "Traceback" not in stderr and "SpoolBusyError" not in stderr, stderr[-3000:]
    report = read_rank_file(only_rank_file(spool, "0"))
    assert report.meta.pid == pid and report.meta.finished
    assert node_state(spool) is None  # finished: no liveness series, never dead


def test_a_killed_worker_is_dead(tmp_path):
    process, spool, _ = launch(tmp_path, "main", "spawn")
    try:
        pid = trained_pid(tmp_path)
        wait_until(
            lambda: list(spool.glob("rank-0.*.prom")) and read_rank_file(only_rank_file(spool, "0")).meta.pid == pid,
            what="the worker's report",
        )
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: node_state(spool) == "dead", what="the killed worker to be seen dead")
        assert not read_rank_file(only_rank_file(spool, "0")).meta.finished
    finally:
        process.kill()
        process.wait()
