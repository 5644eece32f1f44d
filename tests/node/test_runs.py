"""Runs on one machine never mix: each process knows its run, the spool keys files by run and rank, a rank's own
endpoint shows its run only, and the node daemon shows every run labelled by run_id."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.daemon import Daemon
from tests.support.exposition import samples, scrape
from tests.support.paths import RUN, SCRIPTS
from tests.support.processes import TrainingRun, wait_until, xla_env
from tests.support.spool_writer import Writer

pytestmark = pytest.mark.training


def steps_by_run(text: str) -> dict[tuple[str, str], float]:
    """{(run_id, rank): steps} of a scrape."""
    return {
        (dict(labels)["run_id"], dict(labels)["rank"]): v
        for (name, labels), v in samples(text).items()
        if name == "xla_steps_total"
    }


def test_two_single_process_runs_at_once_on_one_spool_are_two_runs(tmp_path, daemons):
    spool = tmp_path / "spool"
    daemon = Daemon(tmp_path, "--addr", "127.0.0.1", "--port", "0", "--spool-dir", str(spool))
    daemons(daemon)
    env = xla_env(
        NEURON_EXPORTER_AUTO="1",
        NEURON_EXPORTER_SPOOL_DIR=str(spool),
        NEURON_EXPORTER_SPOOL_INTERVAL_SECONDS="0.1",
        NEURON_EXPORTER_PORT="0",
    )
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    runs = [
        subprocess.Popen(
            [sys.executable, str(SCRIPTS / "plain_train.py"), str(tmp_path / name), steps],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, steps in (("a", "3"), ("b", "5"))
    ]
    try:
        shown = wait_until(
            lambda: sorted(steps_by_run(scrape(daemon.url)).values()) == [3, 5] and steps_by_run(scrape(daemon.url)),
            timeout=240,
            what="both runs on the daemon",
        )
        assert {rank for _, rank in shown} == {"0"} and len({run for run, _ in shown}) == 2
        # each run is its own process: <pid>-<start time>
        assert {run.split("-")[0] for run, _ in shown} == {str(process.pid) for process in runs}
        for name in ("a", "b"):
            (tmp_path / name / "release").write_text("")
        for process in runs:
            _, stderr = process.communicate(timeout=120)
            assert process.returncode == 0 and "Traceback" not in stderr and "neuron-exporter" not in stderr, stderr
    finally:
        for process in runs:
            process.kill()


def test_a_rank_after_a_finished_run_shows_only_its_own_run_on_its_endpoint(tmp_path):
    spool = tmp_path / "spool"
    with Writer(spool, "0,1", "--finished", "--steps", "9"):  # an earlier two-rank run, finished, kept an hour
        env = xla_env(TEST_SPOOL_DIR=str(spool))
        with TrainingRun("train_scenario.py", "clean", "3", env=env) as run:
            own = steps_by_run(scrape(run.result()["url"]))
            code, _ = run.finish()
    assert code == 0
    assert len(own) == 1 and list(own.values()) == [3]
    ((only_run, rank),) = own
    assert rank == "0" and only_run != RUN


def test_the_daemon_shows_every_run_labelled_by_run_id(tmp_path, daemons):
    spool = tmp_path / "spool"
    with Writer(spool, "0,1", "--finished", "--steps", "9"):
        env = xla_env(TEST_SPOOL_DIR=str(spool), NEURON_EXPORTER_SPOOL_INTERVAL_SECONDS="0.1")
        with TrainingRun("train_scenario.py", "clean", "3", env=env) as run:
            run.result()
            daemon = Daemon(tmp_path, "--addr", "127.0.0.1", "--port", "0", "--spool-dir", str(spool))
            daemons(daemon)
            shown = wait_until(
                lambda: len(steps_by_run(scrape(daemon.url))) == 3 and steps_by_run(scrape(daemon.url)),
                what="the training run beside the finished one",
            )
            run.finish()
    assert shown[(RUN, "0")] == shown[(RUN, "1")] == 9
    (other,) = [key for key in shown if key[0] != RUN]
    assert other[1] == "0" and shown[other] == 3
