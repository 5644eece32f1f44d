"""Multi-rank training with attach(): real ranks (torch_xla on the CPU device), the node endpoint, the daemon.

Each test launches real rank processes running tests/scripts/multirank_train.py and steers them through files in
a control directory; every wait is on an observable condition (a file, a scraped value).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.error
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.daemon import Daemon
from tests.support.exposition import scrape, value
from tests.support.paths import ROOT
from tests.support.processes import wait_until, xla_env

SCRIPT = ROOT / "tests" / "scripts" / "multirank_train.py"
TORCHRUN = Path(sys.executable).parent / "torchrun"
START_TIMEOUT = 300  # two ranks importing torch_xla and compiling on a two-core machine

pytestmark = [
    pytest.mark.training,
    pytest.mark.skipif(not TORCHRUN.exists(), reason="torchrun is not installed next to this Python"),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def try_scrape(url: str) -> str | None:
    try:
        return scrape(url)
    except (urllib.error.URLError, ConnectionError, OSError):
        return None


def rank_env(spool: Path, port: int, **extra: str) -> dict[str, str]:
    return xla_env(
        NEURON_EXPORTER_SPOOL_DIR=str(spool),
        NEURON_EXPORTER_PORT=str(port),
        NEURON_EXPORTER_ADDR="127.0.0.1",
        NEURON_EXPORTER_SPOOL_INTERVAL_SECONDS="0.2",
        **extra,
    )


class Run:
    """Rank processes: a torchrun launch, or one process per rank started with torchrun's variables."""

    def __init__(self, tmp_path: Path, *args: str, env: dict[str, str], torchrun: bool = True):
        self.control = tmp_path / "control"
        self.control.mkdir(exist_ok=True)
        self.logs = []
        self.processes = []
        if torchrun:
            self._start(
                tmp_path / "torchrun.log",
                [str(TORCHRUN), "--standalone", "--nproc-per-node", "2", str(SCRIPT), str(self.control), *args],
                env,
            )
        else:
            for rank in (0, 1):
                rank_vars = {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}
                self._start(
                    tmp_path / f"rank{rank}.log",
                    [sys.executable, str(SCRIPT), str(self.control), *args],
                    {**env, **rank_vars},
                )

    def _start(self, log: Path, command: list[str], env: dict[str, str]) -> None:
        self.logs.append(log)
        with open(log, "w") as out:
            self.processes.append(
                subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            )

    def wait_stepped(self) -> None:
        wait_until(
            lambda: all((self.control / f"stepped-{r}").exists() for r in (0, 1)) or self._failed(),
            timeout=START_TIMEOUT,
            what="both ranks to run their first steps",
        )
        assert not self._failed(), self.output()

    def pid(self, rank: int) -> int:
        return int((self.control / f"pid-{rank}").read_text())

    def release(self) -> None:
        (self.control / "release").write_text("")

    def finish(self, timeout: float = 120) -> dict[int, int]:
        """Wait for the launch to end; every process must exit 0. Returns {rank: steps} the ranks printed."""
        for process in self.processes:
            process.wait(timeout=timeout)
        assert [p.returncode for p in self.processes if p.returncode != -signal.SIGKILL] == [0] * len(
            [p for p in self.processes if p.returncode != -signal.SIGKILL]
        ), self.output()
        return {d["rank"]: d["steps"] for d in map(json.loads, re.findall(r'\{"rank".*\}', self.output()))}

    def _failed(self) -> bool:
        return any(p.poll() not in (None, 0) for p in self.processes)

    def output(self) -> str:
        return "\n".join(log.read_text() for log in self.logs)

    def kill_all(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def start_daemon(tmp_path: Path, spool: Path, port: int = 0) -> Daemon:
    return Daemon(tmp_path, "--addr", "127.0.0.1", "--port", str(port), "--spool-dir", str(spool))


@pytest.fixture
def cleanup():
    things = []
    yield things.append
    for thing in things:
        if isinstance(thing, Run):
            thing.kill_all()
        elif thing.process.poll() is None:
            thing.process.kill()


def shows(url: str, **steps_by_rank: float):
    """The exposition at ``url`` once it shows at least these xla_steps_total per rank (keys r0, r1)."""

    def check():
        text = try_scrape(url)
        if text is None:
            return None
        for key, steps in steps_by_rank.items():
            seen = value(text, "xla_steps_total", rank=key[1:])
            if seen is None or seen < steps:
                return None
        return text

    return check


def counters(text: str) -> dict[tuple[str, frozenset], float]:
    """Every sample of a counter or histogram family: the values that must never go down."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for f in text_string_to_metric_families(text)
        if f.type in ("counter", "histogram")
        for s in f.samples
    }


def test_one_url_shows_both_ranks_without_a_daemon(tmp_path, cleanup):
    """Zero set-up: under torchrun, the rank that gets the port serves every rank of the machine."""
    port = free_port()
    run = Run(tmp_path, "--steps", "4,7", env=rank_env(tmp_path / "spool", port))
    cleanup(run)
    run.wait_stepped()
    url = f"http://127.0.0.1:{port}/metrics"
    text = wait_until(shows(url, r0=4, r1=7), timeout=60, what="both ranks on one endpoint")
    assert value(text, "xla_steps_total", rank="0", local_rank="0") == 4
    assert value(text, "xla_steps_total", rank="1", local_rank="1") == 7
    assert value(text, "neuron_exporter_rank_up", rank="0") == 1
    assert value(text, "neuron_exporter_rank_up", rank="1") == 1
    assert value(text, "neuron_exporter_ranks") == 2
    run.release()
    assert run.finish() == {0: 4, 1: 7}


def test_the_daemon_serves_both_ranks_with_their_own_values(tmp_path, cleanup):
    spool = tmp_path / "spool"
    daemon = start_daemon(tmp_path, spool)
    cleanup(daemon)
    run = Run(tmp_path, "--steps", "3,5", env=rank_env(spool, 0))  # each rank also serves itself on a free port
    cleanup(run)
    run.wait_stepped()
    text = wait_until(shows(daemon.url, r0=3, r1=5), timeout=60, what="the daemon to show both ranks")
    assert value(text, "xla_steps_total", rank="0") == 3
    assert value(text, "xla_steps_total", rank="1") == 5
    assert [value(text, "neuron_exporter_rank_state", rank=r, state="running") for r in "01"] == [1, 1]
    run.release()
    assert run.finish() == {0: 3, 1: 5}
    assert daemon.stop() == 0, daemon.log.read_text()


def test_a_killed_rank_is_dead_keeps_its_counters_and_the_other_goes_on(tmp_path, cleanup):
    # torchrun stops every worker when one fails, so the two ranks are started as torchrun would start them
    # (same variables) but independently: then the survivor can be watched.
    spool = tmp_path / "spool"
    daemon = start_daemon(tmp_path, spool)
    cleanup(daemon)
    run = Run(tmp_path, "--steps", "3,3", "--forever", env=rank_env(spool, 0), torchrun=False)
    cleanup(run)
    run.wait_stepped()
    before = wait_until(shows(daemon.url, r0=3, r1=3), timeout=60, what="both ranks on the daemon")
    steps_of_victim = value(before, "xla_steps_total", rank="1")
    os.kill(run.pid(1), signal.SIGKILL)

    def victim_dead():
        text = try_scrape(daemon.url)
        return text if text and value(text, "neuron_exporter_rank_state", rank="1", state="dead") == 1 else None

    after = wait_until(victim_dead, timeout=60, what="the killed rank to be shown dead")
    assert value(after, "neuron_exporter_rank_up", rank="1") == 0
    assert value(after, "xla_steps_total", rank="1") >= steps_of_victim  # its last counters, not 0, not gone
    survivor = value(after, "xla_steps_total", rank="0")
    later = wait_until(shows(daemon.url, r0=survivor + 3), timeout=60, what="the other rank to go on stepping")
    assert value(later, "neuron_exporter_rank_state", rank="0", state="running") == 1
    assert value(later, "neuron_exporter_rank_state", rank="1", state="dead") == 1
    run.release()
    assert run.processes[1].wait(timeout=60) == -signal.SIGKILL
    assert run.finish()[0] >= survivor + 3
    assert daemon.stop() == 0, daemon.log.read_text()


def test_restarting_the_daemon_loses_nothing(tmp_path, cleanup):
    spool = tmp_path / "spool"
    daemon = start_daemon(tmp_path, spool)
    cleanup(daemon)
    run = Run(tmp_path, "--steps", "3,4", "--forever", env=rank_env(spool, 0))
    cleanup(run)
    run.wait_stepped()
    before = wait_until(shows(daemon.url, r0=3, r1=4), timeout=60, what="both ranks on the daemon")
    assert daemon.stop() == 0, daemon.log.read_text()
    again = start_daemon(tmp_path, spool, port=daemon.port)
    cleanup(again)
    assert again.url == daemon.url
    after = scrape(again.url)
    old, new = counters(before), counters(after)
    assert any(name == "xla_steps_total" for name, _ in old)
    # Every rank's counter is at least where it was; the daemon's own process_* counters start again, as any
    # restarted process's do.
    lost = {
        key: (v, new.get(key))
        for key, v in old.items()
        if not key[0].startswith("process_") and (new.get(key) is None or new[key] < v)
    }
    assert lost == {}
    run.release()
    run.finish()
    assert again.stop() == 0, again.log.read_text()


def test_training_finishes_normally_when_the_daemon_stops_for_good(tmp_path, cleanup):
    spool = tmp_path / "spool"
    daemon = start_daemon(tmp_path, spool)
    cleanup(daemon)
    run = Run(tmp_path, "--steps", "3,3", "--after", "5", env=rank_env(spool, 0))
    cleanup(run)
    run.wait_stepped()
    wait_until(shows(daemon.url, r0=3, r1=3), timeout=60, what="both ranks on the daemon")
    assert daemon.stop() == 0, daemon.log.read_text()
    run.release()
    assert run.finish() == {0: 8, 1: 8}
    assert "Traceback" not in run.output()
