"""Waiting on a condition and running the test scripts in processes of their own."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support import forked
from tests.support.paths import ROOT, SCRIPTS


def wait_until(predicate, timeout: float = 60.0, interval: float = 0.05, what: str = "condition"):
    """Poll ``predicate`` until it returns something truthy; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def marked_line(script: Path, site: str) -> str:
    """``tests/scripts/<script>:N`` of the line of ``script`` marked ``# site: <site>`` (as the exporter names it,
    from the repository root)."""
    for number, line in enumerate(script.read_text().splitlines(), start=1):
        if line.endswith(f"# site: {site}"):
            return f"{script.relative_to(ROOT)}:{number}"
    raise AssertionError(f"no line of {script.name} marked {site}")


def xla_env(**extra: str) -> dict[str, str]:
    """The environment for a child process that runs torch_xla on the CPU device."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("NEURON_EXPORTER_", "XLA_", "PT_XLA_")) and k not in ("RANK", "LOCAL_RANK")
    }
    env.update(PJRT_DEVICE="CPU", PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


def run_python(script: Path | str, *args: str, env: dict[str, str] | None = None, timeout: float = 300.0):
    """Run a Python script in a fresh interpreter (one torch_xla per process); return the completed process."""
    return subprocess.run(
        [sys.executable, str(script), *args], env=env or xla_env(), capture_output=True, text=True, timeout=timeout
    )


class TrainingRun:
    """A training script in its own process that prints one JSON line when its loop is done, then waits for
    its standard input to close: the test scrapes the live endpoint in between."""

    def __init__(self, script: str, *args: str, env: dict[str, str] | None = None, fresh: bool = False):
        """``fresh``: a new interpreter even where a forked one would do (what it imports is part of the test)."""
        env = env or xla_env()
        if not fresh and forked.forkable(
            env
        ):  # the same run, without importing torch_xla again (tests/support/forked.py)
            self.process: subprocess.Popen | forked.ForkedProcess = forked.ForkedProcess(
                SCRIPTS / script, list(args), env
            )
            return
        self.process = subprocess.Popen(
            [sys.executable, str(SCRIPTS / script), *args],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def result(self, timeout: float = 300.0) -> dict:
        ready, _, _ = select.select([self.process.stdout], [], [], timeout)
        line = self.process.stdout.readline() if ready else ""
        if not line:
            self.process.kill()
            pytest.fail(f"training script gave no result; stderr:\n{self.process.stderr.read()[-4000:]}")
        return json.loads(line)

    def finish(self, timeout: float = 60.0) -> tuple[int, str]:
        """Let the script exit; return its exit code and stderr."""
        _, stderr = self.process.communicate(input="", timeout=timeout)
        return self.process.returncode, stderr

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
