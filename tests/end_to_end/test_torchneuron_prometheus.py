"""A real Prometheus scrapes a training run on the emulated TorchNeuron device (an eager loop with CPU-fallback
operators and host reads, and a module compiled with ``torch.compile(backend="neuron")`` that recompiles and falls
back now and then, for as long as it is scraped): every query of the
TorchNeuron dashboard runs through Prometheus' HTTP API and every panel has data (torch 2.14:
`make test-compile-latest PYTHON=python3.13`)."""

from __future__ import annotations

import json
import time

import pytest

from tests.support.paths import DASHBOARDS
from tests.support.processes import TrainingRun, wait_until
from tests.support.prometheus import dashboard_variables, finite_values, running_prometheus, substitute_variables
from tests.support.torchneuron import emulation_problem

pytestmark = [
    pytest.mark.training,
    pytest.mark.neuron,
    pytest.mark.prometheus,
    pytest.mark.skipif(emulation_problem() is not None, reason=str(emulation_problem())),
]

JOB = "neuron-exporter-torchneuron"  # the default selector takes jobs named like neuron-exporter
VARIABLES = dashboard_variables(JOB)


def test_every_panel_of_the_torchneuron_dashboard_has_data(tmp_path):
    board = json.loads((DASHBOARDS / "torchneuron.json").read_text())
    until = tmp_path / "stop"
    with TrainingRun("neuron_train.py", "5", "--attach", "--compile", "--until", str(until), fresh=True) as training:
        target = training.result(timeout=600)["url"].removeprefix("http://").removesuffix("/metrics")
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [{"job_name": JOB, "static_configs": [{"targets": [target]}]}],
        }
        with running_prometheus(config, tmp_path) as api:
            start = time.time()
            wait_until(
                lambda: (api.scalar(f'count_over_time(training_steps_total{{job="{JOB}"}}[1m])') or 0) >= 12,
                timeout=120,
                interval=0.5,
                what="12 scrapes of the TorchNeuron run",
            )
            report, empty = {}, []
            row = ""
            for panel in board["panels"]:
                row = panel["title"] if panel.get("type") == "row" else row
                if row.startswith("Devices"):  # neuron-monitor's, not scraped here: test_device_join_prometheus.py
                    continue
                counts = []
                for query in panel.get("targets", []):
                    expr = substitute_variables(query["expr"], VARIABLES)
                    result = api.query(expr) if query.get("instant") else api.query_range(expr, start, time.time())
                    assert result["status"] == "success", f"{panel['title']}: {expr}: {result.get('error')}"
                    counts.append(finite_values(result))
                if counts:
                    report[panel["title"]] = counts
                    if not any(counts):
                        empty.append(panel["title"])
        until.touch()
        code, stderr = training.finish()
    print("\ntorchneuron.json: finite values per query of each panel:", *report.items(), sep="\n  ")
    assert code == 0, stderr[-3000:]
    assert report and not empty, f"panels without data: {empty}"
