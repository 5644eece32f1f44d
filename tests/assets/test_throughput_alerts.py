"""The throughput alerts with promtool, beyond deploy/prometheus/rules/tests/throughput-*.yml: each silent run of
TrainingThroughputDropped's tests is silent for its own reason (it fires once that guard is lifted), the
configuration reaches both alerts, and a drop share of 1 or more is refused."""

from __future__ import annotations

import subprocess

import pytest
import yaml

pytest.importorskip("grafana_foundation_sdk", reason="the dashboards extra (Python 3.11 or later)")
from neuron_exporter.mixin import build, rules
from neuron_exporter.mixin.config import ConfigError, config_from
from tests.support.paths import ROOT

RULES_DIR = ROOT / build.RULES_DIR
SILENT = "a young run, a run that ended and a run of slow steps stay silent"

# The configuration that lifts each guard, and the run that then fires.
GUARDS = [
    ({"throughput_recent_window": "10m"}, "t4"),  # a window that begins after the young run was first served
    ({"live_window": "30m"}, "t5"),  # the run that ended used CPU time within the last 30m
    ({"throughput_min_steps": 0}, "t6"),  # a step every 2 minutes is enough
]


@pytest.mark.parametrize("overrides, fires", GUARDS, ids=[str(g[0]) for g in GUARDS])
def test_each_silent_run_is_silent_for_its_own_reason(tmp_path, overrides, fires):
    for file_name, content in rules.rule_files(config_from(overrides)).items():
        (tmp_path / file_name).write_text(build.rules_yaml(content))
    committed = yaml.safe_load((RULES_DIR / "tests" / "throughput-alerts.yml").read_text())
    (test,) = [test for test in committed["tests"] if test["name"] == SILENT]
    document = {
        "rule_files": [str(tmp_path / rules.RECORDING_FILE), str(tmp_path / rules.ALERTS_FILE)],
        "evaluation_interval": "15s",
        "tests": [test],
    }
    (tmp_path / "test.yml").write_text(yaml.safe_dump(document, width=200))
    result = subprocess.run(
        ["promtool", "test", "rules", str(tmp_path / "test.yml")], capture_output=True, text=True, timeout=300
    )
    assert result.returncode != 0, f"the silent runs stay silent with {overrides}"
    output = result.stdout + result.stderr
    got = output[output.index("got:") :]
    fired = {run for run in ("t4", "t5", "t6") if f'run_id="{run}"' in got}
    assert "TrainingThroughputDropped" in got and fired == {fires}, output


def test_the_configuration_reaches_the_throughput_alerts():
    changed = config_from(
        {
            "throughput_drop_share": 0.5,
            "throughput_recent_window": "2h",
            "throughput_min_steps": 20,
            "throughput_for": "30m",
            "throughput_severity": "critical",
            "peak_flops_for": "1h",
            "peak_flops_severity": "warning",
        }
    )
    by_name = {rule["alert"]: rule for rule in rules.alert_rules(changed)}
    dropped, peak = by_name["TrainingThroughputDropped"], by_name["TrainingPeakFlopsTooLow"]
    # The recent window ends 35m ago (the 5m, then the `for`), and the run was served when it began, 155m ago.
    assert dropped["expr"].count("[2h] offset 35m)") == 3 and "} offset 155m))" in dropped["expr"]
    assert "\n) < 0.5\n" in dropped["expr"] and ") * 300 >= 20\n" in dropped["expr"]
    assert dropped["for"] == "30m" and dropped["labels"]["severity"] == "critical"
    description = dropped["annotations"]["description"]
    assert "its rate over the 2h that ended 35m ago, and the alert's threshold is 50% of it" in description
    assert "[2h] offset 35m)" in description  # the badput phase that grew, against the same window
    assert peak["expr"] == "max by (cluster, namespace, job, run_id) (run:training_mfu:ratio5m) > 1"
    assert peak["for"] == "1h" and peak["labels"]["severity"] == "warning"


def test_a_drop_share_of_one_or_more_is_refused():
    with pytest.raises(ConfigError, match="throughput_drop_share: 1.0 must be below 1"):
        config_from({"throughput_drop_share": 1})
