"""attach()/detach() life cycle, a busy port, and failures inside the exporter, in a real torch_xla process."""

from __future__ import annotations

import json

import pytest

from tests.support.paths import SCRIPTS
from tests.support.processes import run_python

pytestmark = pytest.mark.training


@pytest.fixture(scope="module")
def lifecycle():
    completed = run_python(SCRIPTS / "attach_lifecycle.py")
    assert completed.returncode == 0, completed.stderr[-4000:]
    return json.loads(completed.stdout.strip().splitlines()[-1]), completed.stderr


def test_a_second_attach_returns_the_same_handle(lifecycle):
    seen, _ = lifecycle
    assert seen["second_attach_is_same_handle"] and seen["hooked_while_attached"] and seen["port_bound"]
    assert seen["steps_while_attached"] == 3


def test_detach_restores_torch_xla_exactly_and_closes_the_endpoint(lifecycle):
    seen, _ = lifecycle
    assert seen["restored_after_detach"] and seen["endpoint_closed_after_detach"]
    assert seen["new_handle_after_detach"] and seen["steps_in_context"] == 2
    assert seen["restored_after_context"]


def test_a_busy_port_is_reported_and_the_loop_is_still_measured(lifecycle):
    seen, stderr = lifecycle
    assert seen["busy_port_handle_port"] is None
    assert seen["busy_port_steps"] == 3
    assert "cannot listen on 127.0.0.1:" in stderr and "training goes on" in stderr


def test_a_failure_inside_the_exporter_is_counted_logged_and_never_raised(lifecycle):
    seen, stderr = lifecycle
    assert seen["broken_step_errors"] == 3
    assert seen["broken_scrape_status"] == 200
    assert seen["broken_scrape_errors"] >= 1
    assert seen["broken_xla_collector_success"] == 0
    assert seen["broken_steps_collector_success"] == 1
    assert seen["broken_scrape_still_has_process_metrics"]
    assert "step hook failed" in stderr and "RuntimeError: injected failure" in stderr
    assert stderr.count("step hook failed") == 1  # three failures, one line: the metric counts the rest
    assert "Traceback" not in stderr
