"""Every source that cannot start at its library's import is shown as not started, counted and logged once, and
started at the training thread's next chance (an optimizer made): from then on it counts as if nothing had failed."""

from __future__ import annotations

import importlib.util
import json

import pytest

from tests.support.exposition import total, value
from tests.support.paths import SCRIPTS
from tests.support.processes import run_python, xla_env

pytestmark = pytest.mark.training

HAS_XLA = importlib.util.find_spec("torch_xla") is not None
COUNTED = {  # what the source counts of three steps once it has started
    "training_steps": ("training_steps_total", 3),
    "torch_compile": ("torch_compile_compilations_total", 1),
    "xla": ("xla_steps_total", 3),
}


@pytest.mark.parametrize("source", sorted(COUNTED))
def test_a_source_that_fails_to_install_starts_at_the_next_chance(source):
    if source == "xla" and not HAS_XLA:
        pytest.skip("torch_xla is not installed")
    result = run_python(SCRIPTS / "source_retry.py", source, env=xla_env())
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout.splitlines()[-1])
    assert seen["tries"] == 2
    assert value(seen["before"], "neuron_exporter_source_started", source=source) == 0
    assert value(seen["after"], "neuron_exporter_source_started", source=source) == 1
    assert value(seen["after"], "neuron_exporter_collection_errors_total", stage="step") == 1
    said = [line for line in result.stderr.splitlines() if f"injected failure of {source}" in line]
    assert len(said) == 1, result.stderr[-3000:]
    family, expected = COUNTED[source]
    assert total(seen["after"], family) == expected
