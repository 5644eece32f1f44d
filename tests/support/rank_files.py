"""The rank files of a spool directory."""

from __future__ import annotations

import json
from pathlib import Path

import psutil

from tests.support.paths import RUN


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
