"""Helpers shared by the tests: waiting on a condition, scraping, reading an exposition."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parent.parent
# The run of this process and of the simulated ranks it starts (training scripts get their own: see xla_env).
RUN = "test-run"
os.environ["NEURON_EXPORTER_RUN_ID"] = RUN


def rank_file(directory, rank: str, run: str = RUN, suffix: str = ".prom") -> Path:
    return Path(directory) / f"rank-{rank}.{run}{suffix}"


def only_rank_file(directory, rank: str) -> Path:
    """The one rank file of ``rank`` in ``directory``, whatever its run (a training script's own)."""
    found = sorted(Path(directory).glob(f"rank-{rank}.*.prom"))
    assert len(found) == 1, found
    return found[0]


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


def scrape(url: str, timeout: float = 10.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read().decode()


def samples(exposition: str) -> dict[tuple[str, frozenset], float]:
    """{(sample name, frozenset of label items): value} for every sample of an exposition."""
    result = {}
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            result[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return result


def series(exposition: str, name: str) -> dict[tuple, float]:
    """{(label values but the rank's own labels (run_id, rank, local_rank), sorted by label name): value} of one
    family."""
    found = {}
    for (sample, labels), v in samples(exposition).items():
        if sample == name:
            found[tuple(value for key, value in sorted(labels) if key not in ("rank", "local_rank", "run_id"))] = v
    return found


def marked_line(script: Path, site: str) -> str:
    """``tests/scripts/<script>:N`` of the line of ``script`` marked ``# site: <site>`` (as the exporter names it,
    from the repository root)."""
    for number, line in enumerate(script.read_text().splitlines(), start=1):
        if line.endswith(f"# site: {site}"):
            return f"{script.relative_to(ROOT)}:{number}"
    raise AssertionError(f"no line of {script.name} marked {site}")


def value(exposition: str, name: str, **labels: str) -> float | None:
    """The value of the one sample called ``name`` whose labels include ``labels``; None if there is none."""
    found = [v for (n, ls), v in samples(exposition).items() if n == name and set(labels.items()) <= ls]
    assert len(found) <= 1, f"{name}{labels} matches {len(found)} series"
    return found[0] if found else None


def total(exposition: str, name: str, **labels: str) -> float:
    """The sum of every sample called ``name`` whose labels include ``labels`` (0 if there is none)."""
    return sum(v for (n, ls), v in samples(exposition).items() if n == name and set(labels.items()) <= ls)


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


SCRIPTS = ROOT / "tests" / "scripts"


class TrainingRun:
    """A training script in its own process that prints one JSON line when its loop is done, then waits for
    its standard input to close: the test scrapes the live endpoint in between."""

    def __init__(self, script: str, *args: str, env: dict[str, str] | None = None):
        self.process = subprocess.Popen(
            [sys.executable, str(SCRIPTS / script), *args],
            env=env or xla_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def result(self, timeout: float = 300.0) -> dict:
        import json
        import select

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
