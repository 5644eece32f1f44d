"""The rank files of a spool directory."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import psutil

from neuron_exporter.node.spool_reader import read_rank_file
from tests.support.paths import RUN
from tests.support.processes import xla_env


def rank_file(directory, rank: str, run: str = RUN, suffix: str = ".prom") -> Path:
    return Path(directory) / f"rank-{rank}.{run}{suffix}"


def only_rank_file(directory, rank: str) -> Path:
    """The one rank file of ``rank`` in ``directory``, whatever its run (a training script's own)."""
    found = sorted(Path(directory).glob(f"rank-{rank}.*.prom"))
    assert len(found) == 1, found
    return found[0]


def rank_file_bytes(rank: str, exposition: bytes, **header) -> bytes:
    me = psutil.Process()
    fields = {
        "format": 2,
        "run_id": RUN,
        "rank": rank,
        "local_rank": rank,
        "pid": me.pid,
        "start_time": me.create_time(),
        "finished": False,
        "last_step_time": None,
        **header,
    }
    return json.dumps(fields).encode() + b"\n" + exposition


def steps_exposition(rank: str, name: str = "xla_steps_total", labels: str | None = None) -> bytes:
    labels = labels if labels is not None else f'local_rank="{rank}",rank="{rank}",run_id="{RUN}"'
    return (f"# HELP {name} Steps\n# TYPE {name} counter\n{name}{{{labels}}} 7.0\n").encode()


def hostile_rank_file(rank: str, size: int) -> bytes:
    """A rank file of about ``size`` bytes that the node endpoint serves: as many short series as fit, the costliest
    file a local user can lay for the endpoint to check and for Prometheus to ingest."""
    labels = f'local_rank="{rank}",rank="{rank}",run_id="{RUN}"'
    head = b"# HELP xla_events_total Every other torch_xla counter\n# TYPE xla_events_total counter\n"
    line = len(f'xla_events_total{{counter="c0000000",{labels}}} 1.0\n')
    room = size - len(rank_file_bytes(rank, head))
    lines = [f'xla_events_total{{counter="c{n:07d}",{labels}}} 1.0\n' for n in range(max(1, room // line))]
    return rank_file_bytes(rank, head + "".join(lines).encode())


def spooled_exposition(tmp_path, command: list[str], **env: str) -> str:
    """Run ``command`` (a training run with the exporter attached by zero code) to its end and return the exposition
    its rank 0 left in its spool; the run must end cleanly, and the exporter must have said nothing."""
    spool = tmp_path / "spool"
    environment = xla_env(NEURON_EXPORTER_SPOOL_DIR=str(spool), NEURON_EXPORTER_PORT="0", **env)
    result = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    complaints = [line for line in result.stderr.splitlines() if "neuron-exporter:" in line or "Traceback" in line]
    assert complaints == [], result.stderr
    report = read_rank_file(only_rank_file(spool, "0"))
    assert report is not None and report.meta.finished
    return report.exposition.decode()
