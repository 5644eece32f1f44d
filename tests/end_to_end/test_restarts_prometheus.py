"""A data-parallel run under ``neuron-exporter run -- torchrun --max-restarts 1`` in which one rank dies: a real
Prometheus with the shipped rules sees one restart per rank, no series of the ranks' phases, lost work or restarts
go back, and the recovery and work lost match the job's own clocks. The same job without the crash: no restart,
nothing lost, over several runs. The straggler of such a run, named by TrainingStraggler, takes the alert's 20
minutes: ``test_run_health_slow.py`` (``make test-run-health``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from neuron_exporter.node.spool_reader import read_rank_file
from tests.support.daemon import free_port
from tests.support.paths import ROOT, SCRIPTS
from tests.support.processes import wait_until, xla_env
from tests.support.prometheus import running_prometheus

pytestmark = [pytest.mark.training, pytest.mark.prometheus]

TORCHRUN = Path(sys.executable).parent / "torchrun"
RULES = ROOT / "deploy" / "prometheus" / "rules"
RANKS, STEPS, DIE_RANK, DIE_STEP, CHECKPOINT_EVERY = 4, 60, 2, 27, 10
SPOOL_INTERVAL = 0.2
# A dead process's last report is about one spool interval old at most (two, allowing for a loaded machine): what it
# did after it is recovery to the exporter, whether it was work lost (past the step resumed from) or kept (before it).
# A process that ends by an exception reports once more as it exits, after its clocks recorded its end: that moves
# the parts the other way, by its exit's time, well inside the same bound.
UNTOLD = 2 * SPOOL_INTERVAL + 0.1
COUNTERS = ("training_time_seconds_total", "training_lost_seconds_total", "training_restarts_total")


def run_job(tmp_path: Path, crash: bool) -> tuple[Path, Path, dict]:
    """The job, scraped every second by Prometheus with the shipped rules; (spool, clocks, Prometheus's figures)."""
    clocks, spool, port = tmp_path / "clocks", tmp_path / "spool", free_port()
    clocks.mkdir()
    script = [str(SCRIPTS / "restarted_ddp.py"), "--steps", str(STEPS), "--clocks", str(clocks)]
    script += ["--checkpoint", str(tmp_path / "checkpoint.pt"), "--checkpoint-every", str(CHECKPOINT_EVERY)]
    script += ["--device-seconds", "0.1"]
    if crash:
        script += ["--die-rank", str(DIE_RANK), "--die-step", str(DIE_STEP)]
    torchrun = [str(TORCHRUN), "--standalone", "--nproc-per-node", str(RANKS), "--max-restarts", "1", *script]
    command = [sys.executable, "-m", "neuron_exporter", "run", "--addr", "127.0.0.1", "--port", str(port)]
    command += ["--spool-dir", str(spool), "--", *torchrun]
    env = xla_env(
        NEURON_EXPORTER_SPOOL_INTERVAL_SECONDS=str(SPOOL_INTERVAL),
        TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1",  # torch 2.9's torchrun restarts gloo workers only so
        OMP_NUM_THREADS="1",
    )
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(path) for path in sorted(RULES.glob("*.yml"))],
        "scrape_configs": [{"job_name": "neuron-exporter", "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}],
    }
    with running_prometheus(config, tmp_path) as prometheus:
        job = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            output, _ = job.communicate(timeout=300)
        finally:
            job.kill()
        assert job.returncode == 0, output[-4000:]

        def finished_scraped() -> dict | None:  # the finished ranks' last values, once Prometheus has them
            restarts = prometheus.by_rank("max by (rank) (training_restarts_total)")
            steps = prometheus.by_rank('max by (rank) (training_time_seconds_total{phase="other"})')
            return restarts if restarts and steps and len(steps) == RANKS and min(steps.values()) > 0 else None

        restarts = wait_until(finished_scraped, timeout=60, interval=0.5, what="the finished ranks' last values")
        figures = {
            "restarts": restarts,
            "resets": {name: prometheus.scalar(f"sum(resets({name}[10m]))") for name in COUNTERS},
            "lost": prometheus.by_rank("max by (rank) (training_lost_seconds_total)"),
            "recovery": prometheus.by_rank('max by (rank) (training_time_seconds_total{phase="recovery"})'),
        }
    return spool, clocks, figures


def expected(clocks: Path, rank: int) -> tuple[float, float]:
    """(recovery, lost) by the job's clocks: from the end of the rank's first process (as it recorded it: its death,
    torchrun's SIGTERM, or the failure of a collective the dead rank left; the dead one's if it had no chance to) to
    its second's start; its steps past the step the second resumed from, and
    the stretch from its last step to its end."""
    first = json.loads((clocks / f"{rank}.0.json").read_text())
    second = json.loads((clocks / f"{rank}.1.json").read_text())
    died = json.loads((clocks / f"{DIE_RANK}.0.json").read_text())["ended"]
    ended = first.get("ended", died)
    lost = sum(seconds for step, seconds in first["steps"] if step > second["resumed"]) + ended - first["last_step"]
    return second["start"] - ended, lost


@pytest.mark.skipif(not TORCHRUN.exists(), reason="torchrun is not installed next to this Python")
def test_a_run_restarted_by_torchrun_goes_on_with_its_recovery_and_lost_work(tmp_path):
    spool, clocks, figures = run_job(tmp_path, crash=True)
    assert figures["restarts"] == {str(rank): 1 for rank in range(RANKS)}
    assert figures["resets"] == dict.fromkeys(COUNTERS, 0.0)
    for rank in range(RANKS):
        second = json.loads((clocks / f"{rank}.1.json").read_text())
        assert second["resumed"] == DIE_STEP // CHECKPOINT_EVERY * CHECKPOINT_EVERY
        recovery, lost = expected(clocks, rank)
        # What the dead process did after its last report is recovery to the exporter: the parts move by as much, and
        # their sum moves only by what it did before the step resumed from after its last report.
        shown_recovery, shown_lost = figures["recovery"][str(rank)], figures["lost"][str(rank)]
        assert abs(shown_recovery + shown_lost - recovery - lost) < UNTOLD, (rank, shown_recovery, shown_lost, figures)
        assert abs(shown_recovery - recovery) < UNTOLD, (rank, recovery, figures)
        assert abs(shown_lost - lost) < UNTOLD, (rank, lost, figures)
        (path,) = spool.glob(f"rank-{rank}.*.prom")
        assert read_rank_file(path).meta.finished


@pytest.mark.skipif(not TORCHRUN.exists(), reason="torchrun is not installed next to this Python")
@pytest.mark.parametrize("run", range(3))
def test_a_run_without_a_crash_restarts_nothing_and_loses_nothing(tmp_path, run):
    _, _, figures = run_job(tmp_path, crash=False)
    assert figures["restarts"] == {str(rank): 0 for rank in range(RANKS)}
    assert figures["lost"] == {str(rank): 0 for rank in range(RANKS)}
    assert figures["recovery"] == {str(rank): 0 for rank in range(RANKS)}
    assert figures["resets"] == dict.fromkeys(COUNTERS, 0.0)
    assert os.path.exists(tmp_path / "checkpoint.pt")
