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
