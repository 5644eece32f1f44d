"""``neuron-exporter serve`` with a configuration it must refuse before starting."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support.paths import ROOT


def serve(tmp_path: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    spool = tmp_path / "spool-never-created"
    environment = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), **(env or {})}
    result = subprocess.run(
        [sys.executable, "-m", "neuron_exporter", "serve", "--port", "0", "--spool-dir", str(spool), *args],
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert not spool.exists(), "the daemon started before rejecting its configuration"
    return result
