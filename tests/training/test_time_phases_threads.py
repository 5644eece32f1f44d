"""``training_time_seconds_total{phase}`` with several threads, autograd's thread and a second ``attach()``, against
the script's own clocks (``tests/scripts/threaded_phases.py``): real ``torch.compile`` and torch_xla processes."""

from __future__ import annotations

import json

import pytest

from tests.support.paths import SCRIPTS
from tests.support.processes import run_python, xla_env

try:
    import torch_xla  # noqa: F401

    HAS_XLA = True
except ImportError:
    HAS_XLA = False

TOLERANCE, FLOOR = 0.15, 0.1  # a phase matches the script's clock within 15% or 0.1 s

pytestmark = pytest.mark.training


def run(case: str) -> dict:
    done = run_python(SCRIPTS / "threaded_phases.py", case, env=xla_env(), timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def near(exported: float, clock: float) -> bool:
    return abs(exported - clock) <= max(TOLERANCE * clock, FLOOR)


@pytest.mark.compile
def test_two_training_threads_leave_nothing_open_and_the_first_ones_phases_are_served():
    result = run("two_trainers")
    exported, clocks = result["exported"], result["clocks"]
    assert all(growth == 0.0 for growth in result["idle_growth"].values()), result["idle_growth"]
    assert near(exported["data"], clocks["data"]) and clocks["data"] > 1.0, result
    assert near(exported["checkpoint"], clocks["checkpoint"]), result
    assert clocks["compile"] <= exported["compile"] <= clocks["compile_calls"] + FLOOR, result


@pytest.mark.compile
def test_a_compilation_inside_another_threads_is_the_training_threads_and_the_others_is_not():
    """The training thread's backward graph compiles while an evaluation thread's compilation is open."""
    result = run("evaluator")
    exported, clocks = result["exported"], result["clocks"]
    assert result["compilers_run"] == 2  # the forward and the backward graph, each COMPILE_SECONDS
    assert result["backward"] >= 0.3  # the backward compiled lazily, at the first backward
    assert near(exported["compile"], clocks["compile_calls"]), result  # the evaluator's held compilation is not
    assert exported["step"] < result["backward"], result


@pytest.mark.skipif(not HAS_XLA, reason="torch_xla is not installed")
def test_openxla_graphs_compiled_at_their_first_run_on_autograds_thread_are_compile():
    result = run("openxla")
    exported = result["exported"]
    assert exported["compile"] >= result["xla_compile_seconds"] > 0, result
    assert exported["step"] < result["first_backward"], result


def test_attach_after_detach_goes_on_from_the_same_totals():
    result = run("reattach")
    at_detach, after, exported = result["at_detach"], result["after_attach"], result["exported"]
    assert after["startup"] == at_detach["startup"]  # the new handle's start-up is not the process's whole past
    assert 0.5 <= after["other"] - at_detach["other"] < 5.0  # detached: after a step, the base's time is other
    assert all(exported[phase] >= after[phase] for phase in exported), result
    assert exported["data"] > at_detach["data"] > 0 and exported["step"] > at_detach["step"] > 0
    assert near(exported["data"], result["clocks"]["data"]), result
