"""Two runs never share a rank file: run ids are kept exact in labels and escaped one to one in file names, and a
process-based id tells containers (PID namespaces) apart."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from neuron_exporter.config import resolve_options
from neuron_exporter.node.exposition_check import escape_label_value
from neuron_exporter.node.node_view import NodeView
from neuron_exporter.node.spool_format import RankMeta
from neuron_exporter.node.spool_writer import release_rank_lock, write_rank_file
from tests.support.exposition import samples
from tests.support.paths import ROOT

RUNS = ["job/1", "job 1", "job_1", "a:b", "a_b", "x" * 70 + "1", "x" * 70 + "2", 'quote"and\\backslash', "0.x"]


def exposition(run_id: str, steps: int) -> bytes:
    labels = f'local_rank="0",rank="0",run_id="{escape_label_value(run_id)}"'
    header = "# HELP xla_steps_total Steps\n# TYPE xla_steps_total counter\n"
    return f"{header}xla_steps_total{{{labels}}} {steps}.0\n".encode()


def steps_by_run(text: str) -> dict[str, float]:
    return {dict(labels)["run_id"]: v for (name, labels), v in samples(text).items() if name == "xla_steps_total"}


def test_runs_whose_ids_differ_only_in_escaped_characters_or_past_64_characters_stay_apart(tmp_path):
    try:
        for steps, run in enumerate(RUNS, start=1):
            write_rank_file(tmp_path, RankMeta.current("0", "0", run_id=run), exposition(run, steps))
        assert len(list(tmp_path.glob("rank-0.*.prom"))) == len(RUNS)
        text = NodeView(resolve_options(env={}, overrides={"spool_dir": str(tmp_path)})).render().decode()
    finally:
        for run in RUNS:
            release_rank_lock(tmp_path, "0", run)
    assert steps_by_run(text) == {run: float(steps) for steps, run in enumerate(RUNS, start=1)}
    check = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


WRITE_AS_PID_1 = """
import json, os, sys
sys.path.insert(0, sys.argv[2])
from neuron_exporter import run_identity
from neuron_exporter.node.spool_format import RankMeta
from neuron_exporter.node.spool_writer import write_rank_file
from neuron_exporter.node.exposition_check import escape_label_value
run = run_identity.run_id()
labels = f'local_rank="0",rank="0",run_id="{escape_label_value(run)}"'
text = f"# HELP xla_steps_total Steps\\n# TYPE xla_steps_total counter\\nxla_steps_total{{{labels}}} 3.0\\n"
write_rank_file(sys.argv[1], RankMeta.current("0", "0"), text.encode())
print(json.dumps({"pid": os.getpid(), "run": run}), flush=True)
sys.stdin.read()
"""


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare (util-linux)")
def test_two_containers_first_processes_are_two_runs(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}  # no NEURON_EXPORTER_RUN_ID: the default identity
    processes = [
        subprocess.Popen(
            [
                "unshare",
                "--pid",
                "--fork",
                "--mount-proc",
                sys.executable,
                "-c",
                WRITE_AS_PID_1,
                str(tmp_path),
                str(ROOT),
            ],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    try:
        seen = [json.loads(process.stdout.readline() or "{}") for process in processes]
        assert [s.get("pid") for s in seen] == [1, 1], [p.stderr.read() for p in processes if p.poll() is not None]
        assert seen[0]["run"] != seen[1]["run"]
        text = NodeView(resolve_options(env={}, overrides={"spool_dir": str(tmp_path)})).render().decode()
        assert steps_by_run(text) == {seen[0]["run"]: 3.0, seen[1]["run"]: 3.0}
    finally:
        for process in processes:
            process.stdin.close()
            process.wait(timeout=30)
