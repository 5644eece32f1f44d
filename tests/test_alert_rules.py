"""The Prometheus rules: committed YAML equals a fresh build, promtool accepts them, every alert is tested by
`promtool test rules` and documented in the runbook, and the thresholds can be changed in one place."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys

import pytest
import yaml

from conftest import ROOT
from test_dashboards import CONTRACT_METRICS, metric_names

from dashboards import build, rules
from dashboards.config import DEFAULTS, RUNBOOK_URL, Thresholds, ThresholdsError, load_thresholds

RULES_DIR = build.RULES_DIR
RULE_FILES = [RULES_DIR / rules.RECORDING_FILE, RULES_DIR / rules.ALERTS_FILE]
TEST_FILES = sorted((RULES_DIR / "tests").glob("*.yml"))
RUNBOOK = ROOT / "deploy" / "prometheus" / "runbook.md"


def committed_alerts() -> list[dict]:
    return yaml.safe_load(RULE_FILES[1].read_text())["groups"][0]["rules"]


def promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["promtool", *args], capture_output=True, text=True, timeout=120)


def test_committed_rules_are_what_the_code_builds(tmp_path):
    build.write_all(dashboards_dir=tmp_path / "dashboards", rules_dir=tmp_path / "rules")
    for path in RULE_FILES:
        fresh = (tmp_path / "rules" / path.name).read_text()
        assert path.read_text() == fresh, f"{path.relative_to(ROOT)} is stale: run `make dashboards` and commit"


def test_promtool_check_rules_is_clean():
    result = promtool("check", "rules", *map(str, RULE_FILES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 11 rules found" in result.stdout and "SUCCESS: 8 rules found" in result.stdout


@pytest.mark.parametrize("test_file", TEST_FILES, ids=lambda p: p.name)
def test_promtool_unit_tests_pass(test_file):
    result = promtool("test", "rules", str(test_file))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promtool_unit_tests_fail_when_an_alert_changes(tmp_path):
    """The unit tests check the exact annotations: a changed description makes them fail."""
    (tmp_path / "tests").mkdir()
    for path in RULE_FILES:
        (tmp_path / path.name).write_text(path.read_text().replace("has no XLA lowering", "lacks a lowering"))
    test_file = tmp_path / "tests" / "xla-alerts.yml"
    test_file.write_text((RULES_DIR / "tests" / "xla-alerts.yml").read_text())
    result = promtool("test", "rules", str(test_file))
    assert result.returncode != 0 and "XlaCpuFallbackOp" in result.stdout + result.stderr


def unit_test_cases() -> list[tuple[dict, dict]]:
    """(test, alert_rule_test) of every promtool unit test."""
    return [(test, case) for path in TEST_FILES for test in yaml.safe_load(path.read_text())["tests"]
            for case in test.get("alert_rule_test", [])]


def identity(labels: dict) -> frozenset:
    """The labels that say which rank, operator, stage... a series or an alert is about."""
    return frozenset((k, v) for k, v in labels.items() if k not in ("__name__", "le", "state", "severity"))


def series_labels(series: str) -> dict:
    return dict(re.findall(r'(\w+)="([^"]*)"', series))


@pytest.mark.parametrize("alert", [rule["alert"] for rule in committed_alerts()])
def test_every_alert_has_a_firing_and_a_silent_unit_test(alert):
    cases = [(test, case) for test, case in unit_test_cases() if case["alertname"] == alert]
    firing = [(test, case) for test, case in cases if case["exp_alerts"]]
    assert firing, f"no promtool test expects {alert} to fire"
    for _, case in firing:
        for expected in case["exp_alerts"]:
            assert set(expected["exp_annotations"]) == {"summary", "description", "runbook_url"}
            assert expected["exp_labels"]["severity"]
    # Silent on a clean series: an evaluation that expects no alert, or a firing one in which some input series
    # (a clean rank, stage, collector...) gets no alert.
    silent = any(not case["exp_alerts"] for _, case in cases) or any(has_clean_series(*pair) for pair in firing)
    assert silent, f"no promtool test shows {alert} silent on a clean series"


def has_clean_series(test: dict, case: dict) -> bool:
    alerted = [identity(expected["exp_labels"]) for expected in case["exp_alerts"]]
    return any(not any(identity(series_labels(series["series"])) >= labels for labels in alerted)
               for series in test["input_series"])


@pytest.mark.parametrize("rule", committed_alerts(), ids=lambda r: r["alert"])
def test_every_alert_has_severity_summary_description_and_runbook(rule):
    assert rule["labels"]["severity"] in ("warning", "critical")
    annotations = rule["annotations"]
    assert set(annotations) == {"summary", "description", "runbook_url"}
    assert annotations["runbook_url"] == f"{RUNBOOK_URL}#{rule['alert'].lower()}"
    if "rank" in rule["expr"] or rule["expr"].startswith("rank"):
        assert "$labels.rank" in annotations["description"], f"{rule['alert']} does not name the rank"
    if "op)" in rule["expr"]:
        assert "$labels.op" in annotations["description"] and "$labels.op" in annotations["summary"]


def test_runbook_has_one_section_per_alert_and_nothing_else():
    headings = re.findall(r"^## (.+)$", RUNBOOK.read_text(), flags=re.MULTILINE)
    assert headings == [rule["alert"] for rule in committed_alerts()]
    # GitHub's anchor for "## XlaCpuFallbackOp" is "#xlacpufallbackop", which runbook_url uses.
    assert all(re.fullmatch(r"[A-Za-z]+", heading) for heading in headings)


def test_readme_lists_every_alert():
    readme = (ROOT / "dashboards" / "README.md").read_text()
    for rule in committed_alerts():
        assert f"`{rule['alert']}`" in readme, f"dashboards/README.md does not list {rule['alert']}"


def test_rules_use_only_contract_metrics_and_their_own_recordings():
    recorded = set(rules.RECORDING_RULES)
    for path in RULE_FILES:
        for rule in yaml.safe_load(path.read_text())["groups"][0]["rules"]:
            unknown = metric_names(rule["expr"]) - CONTRACT_METRICS - recorded
            assert not unknown, f"{path.name}: {rule.get('alert') or rule.get('record')} uses {sorted(unknown)}"


def test_recording_rules_are_used_by_the_alerts():
    alert_exprs = " ".join(rule["expr"] for rule in committed_alerts())
    used = {name for name in rules.RECORDING_RULES if name in alert_exprs}
    assert used >= {"rank:xla_recompilations_per_step:ratio5m", "rank:xla_graphs_per_step:avg5m",
                    "rank:xla_device_to_host_transfers_per_step:ratio5m", "rank:xla_compile_time_share:ratio5m"}


def test_a_threshold_changed_in_one_place_reaches_the_rules():
    changed = dataclasses.replace(DEFAULTS, graphs_per_step=2.5, fallback_for="0s", fallback_window="1m")
    by_name = {rule["alert"]: rule for rule in rules.alert_rules(changed)}
    assert by_name["XlaGraphFragmentation"]["expr"].endswith("> 2.5")
    assert "threshold 2.5" in by_name["XlaGraphFragmentation"]["annotations"]["description"]
    assert by_name["XlaCpuFallbackOp"]["for"] == "0s"
    assert "[1m]" in by_name["XlaCpuFallbackOp"]["expr"]


def test_thresholds_file_overrides_defaults(tmp_path):
    path = tmp_path / "thresholds.yml"
    path.write_text("graphs_per_step: 2\nfallback_for: 30s\n")
    loaded = load_thresholds(path)
    assert (loaded.graphs_per_step, loaded.fallback_for, loaded.host_reads_per_step) == (2.0, "30s", 0.5)


@pytest.mark.parametrize("content, message", [
    ("graphs_per_step: 2\ngraph_per_step: 3\n", ":2: unknown threshold 'graph_per_step'"),
    ("fallback_for: 5 minutes\n", "fallback_for: '5 minutes' is not a Prometheus duration"),
    ("host_reads_per_step: lots\n", ":1: host_reads_per_step must be a number, got 'lots'"),
    ("- 1\n", ":1: expected a mapping"),
])
def test_bad_thresholds_file_gives_one_line_naming_the_problem(tmp_path, content, message):
    path = tmp_path / "thresholds.yml"
    path.write_text(content)
    with pytest.raises(ThresholdsError) as error:
        load_thresholds(path)
    assert message in str(error.value) and str(path) in str(error.value) and "\n" not in str(error.value)
    result = subprocess.run([sys.executable, "-m", "dashboards.build", "--thresholds", str(path),
                             "--dashboards-dir", str(tmp_path / "d"), "--rules-dir", str(tmp_path / "r")],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and message in result.stderr
    assert not (tmp_path / "r").exists(), "nothing is written when the thresholds are bad"


def test_thresholds_reject_bad_values_in_code():
    with pytest.raises(ValueError, match="stall_window"):
        Thresholds(stall_window="ten minutes")
