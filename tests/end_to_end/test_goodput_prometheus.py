"""A real Prometheus scrapes a real torch_xla job that recompiles every step: the goodput recording rules show
compile as its largest badput, and TrainingGoodputLow fires for the run, naming compile and what to do."""

from __future__ import annotations

import dataclasses
import json
import select
import subprocess
import sys

import pytest

pytest.importorskip("grafana_foundation_sdk", reason="the dashboards extra (Python 3.11 or later)")
pytest.importorskip("torch_xla", reason="torch_xla is not installed")
from neuron_exporter.mixin import build, rules
from neuron_exporter.mixin.config import DEFAULTS
from tests.support.paths import SCRIPTS
from tests.support.processes import wait_until, xla_env
from tests.support.prometheus import running_prometheus

pytestmark = [pytest.mark.training, pytest.mark.prometheus]


def test_a_job_that_compiles_most_of_the_time_fires_training_goodput_low(tmp_path):
    process = subprocess.Popen(
        [sys.executable, str(SCRIPTS / "compile_bound.py"), str(tmp_path / "stop")],
        env=xla_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        ready, _, _ = select.select([process.stdout], [], [], 300)
        assert ready, "compile_bound.py did not start"
        port = json.loads(process.stdout.readline())["port"]
        # The defaults but a short window and no `for`: the job is young, and the alert must fire while it runs.
        config = dataclasses.replace(DEFAULTS, goodput_window="20s", goodput_for="0s")
        (tmp_path / "rules").mkdir()
        for name, content in rules.rule_files(config).items():
            (tmp_path / "rules" / name).write_text(build.rules_yaml(content))
        prometheus = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(tmp_path / "rules" / name) for name in (rules.RECORDING_FILE, rules.ALERTS_FILE)],
            "scrape_configs": [{"job_name": "neuron-exporter", "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}],
        }
        with running_prometheus(prometheus, tmp_path) as api:

            def fired() -> list[dict]:
                return [
                    a
                    for a in api.alerts()
                    if a["labels"]["alertname"] == "TrainingGoodputLow" and a["state"] == "firing"
                ]

            (alert,) = wait_until(fired, timeout=180, interval=0.5, what="TrainingGoodputLow to fire")
            assert alert["labels"]["job"] == "neuron-exporter" and alert["labels"]["run_id"]
            assert "The largest badput is compile" in alert["annotations"]["description"]

            def badput() -> dict[str, float]:
                return {
                    r["metric"]["phase"]: float(r["value"][1])
                    for r in api.query("run_phase:training_badput:ratio5m")["data"]["result"]
                }

            # The recording rules are a group of their own: their first value may come after the alert's.
            badput = wait_until(badput, timeout=60, interval=0.5, what="run_phase:training_badput:ratio5m")
            assert max(badput, key=badput.get) == "compile", badput
    finally:
        (tmp_path / "stop").touch()
        try:
            process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    assert process.returncode == 0, process.stderr.read()[-4000:]
