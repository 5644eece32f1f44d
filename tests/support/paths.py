"""Where the repository's test inputs are."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "tests" / "scripts"
FIXTURES = ROOT / "tests" / "fixtures"
# The committed dashboards (the rule files are in ROOT / "deploy"), which neuron_exporter/mixin generates.
DASHBOARDS = ROOT / "dashboards"
# The run of the test process and of the simulated ranks it starts (training scripts get their own: see xla_env);
# tests/conftest.py puts it in the environment.
RUN = "test-run"
