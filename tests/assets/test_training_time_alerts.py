"""The start-up and goodput alerts take their start-up threshold, start-up steps and liveness window from the
configuration (what they fire for is in deploy/prometheus/rules/tests/startup-alerts.yml and goodput-alerts.yml)."""

from __future__ import annotations

import pytest

pytest.importorskip("grafana_foundation_sdk", reason="the dashboards extra (Python 3.11 or later)")
from neuron_exporter.mixin import rules
from neuron_exporter.mixin.config import config_from


def test_start_up_and_liveness_keys_reach_the_training_time_alerts():
    changed = config_from(
        {"startup_max_seconds": 5400, "startup_steps": 5, "live_window": "4m", "goodput_window": "1h"}
    )
    by_name = {rule["alert"]: rule for rule in rules.alert_rules(changed)}
    startup, goodput = by_name["TrainingStartupSlow"], by_name["TrainingGoodputLow"]
    assert "(training_time_seconds_total{" in startup["expr"] and "}) > 5400\n" in startup["expr"]
    assert "(training_steps_total{" in startup["expr"] and "}) < 5)" in startup["expr"]
    assert "still starting after 90m" in startup["annotations"]["summary"]
    assert "first 5 training steps 90m after" in startup["annotations"]["description"]
    # A rank that restarted (its training time carried over) counts once its process has made no step for 90m.
    assert "(max_over_time(training_steps_total{" in startup["expr"] and "}[90m])) < 5\n" in startup["expr"]
    assert "} offset 90m)" in startup["expr"] and "(training_restarts_total{" in startup["expr"]
    # Goodput counts a rank once it had made its start-up steps at the window's first sample, while it is live.
    assert "(min_over_time(training_steps_total{" in goodput["expr"] and "}[1h])) >= 5)" in goodput["expr"]
    for rule in (startup, goodput):
        assert "(rate(training_process_cpu_seconds_total{" in rule["expr"] and "}[4m])) > 0)" in rule["expr"]
