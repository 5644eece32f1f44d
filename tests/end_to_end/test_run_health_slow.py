"""Two data-parallel runs side by side under ``neuron-exporter run -- torchrun --max-restarts 1``, scraped every 15 s
by a real Prometheus that evaluates the shipped rules as shipped (``make test-run-health``, about 27 minutes): in
one, rank 1 reads its data slowly and rank 2 dies a minute in; the other is balanced. TrainingStraggler names rank 1
and data in the first, once, and never fires for the balanced run; the first restarts once per rank and goes on,
the other restarts nothing and loses nothing; ``diagnose`` names the restart and the straggler."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.daemon import free_port
from tests.support.paths import ROOT, SCRIPTS
from tests.support.processes import wait_until, xla_env
from tests.support.prometheus import running_prometheus

pytestmark = [pytest.mark.training, pytest.mark.prometheus, pytest.mark.run_health]

TORCHRUN = Path(sys.executable).parent / "torchrun"
RULES = ROOT / "deploy" / "prometheus" / "rules"
RANKS, SLOW_RANK, DIE_RANK, DIE_STEP = 4, 1, 2, 600
MINUTES = 26  # the 5m window and the alert's 15m, after a minute of start-up and the restart
COUNTERS = ("training_time_seconds_total", "training_lost_seconds_total", "training_restarts_total")


def start_job(directory: Path, until: float, straggler: bool) -> tuple[subprocess.Popen, int]:
    directory.mkdir()
    (directory / "clocks").mkdir()
    port = free_port()
    script = [str(SCRIPTS / "restarted_ddp.py"), "--until", str(until), "--clocks", str(directory / "clocks")]
    script += ["--checkpoint", str(directory / "checkpoint.pt"), "--checkpoint-every", "200"]
    if straggler:
        script += ["--slow-rank", str(SLOW_RANK), "--slow-seconds", "0.05"]
        script += ["--die-rank", str(DIE_RANK), "--die-step", str(DIE_STEP)]
    torchrun = [str(TORCHRUN), "--standalone", "--nproc-per-node", str(RANKS), "--max-restarts", "1", *script]
    command = [sys.executable, "-m", "neuron_exporter", "run", "--addr", "127.0.0.1", "--port", str(port)]
    command += ["--spool-dir", str(directory / "spool"), "--", *torchrun]
    env = xla_env(TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1", OMP_NUM_THREADS="1")
    log = (directory / "job.log").open("w")
    return subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT), port


@pytest.mark.skipif(not TORCHRUN.exists(), reason="torchrun is not installed next to this Python")
def test_training_straggler_names_the_slow_rank_of_a_restarted_run_and_never_a_balanced_one(tmp_path):
    until = time.time() + MINUTES * 60
    slow, slow_port = start_job(tmp_path / "slow", until, straggler=True)
    balanced, balanced_port = start_job(tmp_path / "balanced", until, straggler=False)
    config = {
        "global": {"scrape_interval": "15s", "evaluation_interval": "15s"},
        "rule_files": [str(path) for path in sorted(RULES.glob("*.yml"))],
        "scrape_configs": [
            {"job_name": f"neuron-exporter-{name}", "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}
            for name, port in (("slow", slow_port), ("balanced", balanced_port))  # the rules' job matcher
        ],
    }
    try:
        with running_prometheus(config, tmp_path) as prometheus:

            def fired() -> list[dict]:
                return [
                    alert
                    for alert in prometheus.alerts()
                    if alert["labels"]["alertname"] == "TrainingStraggler" and alert["state"] == "firing"
                ]

            alerts = wait_until(fired, timeout=MINUTES * 60 + 120, interval=5, what="TrainingStraggler to fire")
            diagnosed = subprocess.run(
                [sys.executable, "-m", "neuron_exporter", "diagnose", f"http://127.0.0.1:{slow_port}"],
                capture_output=True,
                text=True,
                timeout=60,
            ).stdout
            everything = f"{MINUTES + 2}m"
            pending = prometheus.query(f'max_over_time(ALERTS{{alertname="TrainingStraggler"}}[{everything}])')
            restarts = {
                job: prometheus.by_rank(f'max by (rank) (training_restarts_total{{job="neuron-exporter-{job}"}})')
                for job in ("slow", "balanced")
            }
            lost = prometheus.by_rank('max by (rank) (training_lost_seconds_total{job="neuron-exporter-balanced"})')
            resets = {name: prometheus.scalar(f"sum(resets({name}[{everything}]))") for name in COUNTERS}
    finally:
        for job in (slow, balanced):
            job.terminate()
        for job in (slow, balanced):
            job.wait(timeout=120)
    slow_rank = ("neuron-exporter-slow", str(SLOW_RANK), "data")
    assert [(a["labels"]["job"], a["labels"]["rank"], a["labels"]["phase"]) for a in alerts] == [slow_rank], alerts
    ever = [(s["metric"]["job"], s["metric"]["rank"], s["metric"]["phase"]) for s in pending["data"]["result"]]
    assert set(ever) == {slow_rank}, ever  # never a victim, never the balanced run
    assert restarts == {"slow": {str(r): 1 for r in range(RANKS)}, "balanced": {str(r): 0 for r in range(RANKS)}}
    assert lost == {str(r): 0 for r in range(RANKS)}
    assert resets == dict.fromkeys(COUNTERS, 0.0)
    assert "restarted: 1 time" in diagnosed and f"held back by rank {SLOW_RANK}: its data" in diagnosed, diagnosed
