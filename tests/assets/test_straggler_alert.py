"""TrainingStraggler at the scale it is for, with promtool: one straggler among 64 noisy ranks is one alert naming it
and its phase, balanced 64-rank runs with the same noise are silent; each silent case of
deploy/prometheus/rules/tests/straggler-alerts.yml is silent for its own reason (it fires once that guard is
relaxed); the configuration reaches the rule."""

from __future__ import annotations

import random
import subprocess

import pytest
import yaml

pytest.importorskip("grafana_foundation_sdk", reason="the dashboards extra (Python 3.11 or later)")
from neuron_exporter.mixin import build, rules
from neuron_exporter.mixin.config import config_from
from tests.support.paths import ROOT
from tests.support.straggler_series import run_series

RULES_DIR = ROOT / build.RULES_DIR
SAMPLES = 100  # 25 minutes of 15 s scrapes


def promtool_test(tmp_path, test: dict, rule_dir=RULES_DIR) -> subprocess.CompletedProcess:
    document = {
        "rule_files": [str(rule_dir / rules.RECORDING_FILE), str(rule_dir / rules.ALERTS_FILE)],
        "evaluation_interval": "15s",
        "tests": [test],
    }
    path = tmp_path / "straggler-test.yml"
    path.write_text(yaml.safe_dump(document, width=200))
    return subprocess.run(["promtool", "test", "rules", str(path)], capture_output=True, text=True, timeout=300)


def firing(eval_time: str, *alerts: dict) -> dict:
    """A check that exactly ``alerts`` (their labels) fire at ``eval_time``."""
    samples = []
    for labels in alerts:
        pairs = {"alertname": "TrainingStraggler", "alertstate": "firing", **labels}
        samples.append({"labels": "ALERTS{" + ", ".join(f'{k}="{v}"' for k, v in pairs.items()) + "}", "value": 1})
    expr = 'ALERTS{alertname="TrainingStraggler", alertstate="firing"}'
    return {"expr": expr, "eval_time": eval_time, "exp_samples": samples}


def test_one_straggler_among_64_noisy_ranks_is_one_alert_and_balanced_runs_are_silent(tmp_path):
    rng = random.Random(38)
    runs = [run_series("s1", 64, SAMPLES, rng, straggler=37)]
    runs += [run_series(run, 64, SAMPLES, rng) for run in ("b1", "b2")]
    series = [
        {"series": name, "values": " ".join(f"{value:.4f}" for value in values)} for run in runs for name, values in run
    ]
    straggler = {
        "cluster": "c1",
        "namespace": "ml",
        "job": "neuron-exporter",
        "run_id": "s1",
        "instance": "trn4:19478",
        "rank": "37",
        "local_rank": "5",
        "phase": "data",
        "severity": "warning",
    }
    test = {
        "interval": "15s",
        "input_series": series,
        # Judged from 5m on, firing 15m later; the victims and the balanced runs never.
        "promql_expr_test": [firing(t) for t in ("10m", "19m")] + [firing(t, straggler) for t in ("21m", "24m")],
    }
    result = promtool_test(tmp_path, test)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-2000:]


# Each silent case of the committed tests, the configuration that lifts its guard, and the alert it then gives.
GUARDS = [
    ("a balanced run and a run of three ranks stay silent", {"straggler_min_ranks": 3}, 'rank="1", run_id="d3"'),
    ("a run of slow steps stays silent", {"straggler_min_steps": 10}, 'rank="3", run_id="d4"'),
    ("a one-off save on rank 0 stays silent", {"straggler_for": "0m"}, 'phase="checkpoint", rank="0", run_id="d5"'),
    ("a balanced run and a run of three ranks stay silent", {"straggler_excess_share": 0.01}, 'run_id="d2"'),
]


@pytest.mark.parametrize("name, overrides, fires", GUARDS, ids=[str(g[1]) for g in GUARDS])
def test_each_silent_case_is_silent_for_its_own_reason(tmp_path, name, overrides, fires):
    for file_name, content in rules.rule_files(config_from(overrides)).items():
        (tmp_path / file_name).write_text(build.rules_yaml(content))
    committed = yaml.safe_load((RULES_DIR / "tests" / "straggler-alerts.yml").read_text())
    (test,) = [test for test in committed["tests"] if test["name"] == name]
    result = promtool_test(tmp_path, test, rule_dir=tmp_path)
    assert result.returncode != 0, f"{name} stays silent with {overrides}"
    output = result.stdout + result.stderr
    got = output[output.index("got:") :]
    assert "TrainingStraggler" in got and all(label in got for label in fires.split(", ")), output


def test_the_configuration_reaches_the_straggler_rule():
    changed = config_from(
        {
            "straggler_excess_share": 0.25,
            "straggler_min_ranks": 16,
            "straggler_min_steps": 50,
            "straggler_for": "30m",
            "straggler_severity": "critical",
            "startup_steps": 5,
        }
    )
    (rule,) = [rule for rule in rules.alert_rules(changed) if rule["alert"] == "TrainingStraggler"]
    assert ") > 0.25\n" in rule["expr"]
    assert "(rank:training_steps:rate5m > 0) >= 16)" in rule["expr"]
    assert "(increase(training_steps_total{" in rule["expr"] and "}[5m])) >= 50)" in rule["expr"]
    assert "(min_over_time(training_steps_total{" in rule["expr"] and "}[5m])) >= 5)" in rule["expr"]
    assert rule["for"] == "30m" and rule["labels"]["severity"] == "critical"
    assert "(the alert's threshold is 25%)" in rule["annotations"]["description"]
