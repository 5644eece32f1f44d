"""The rank files of a spool directory."""

from __future__ import annotations

from pathlib import Path

from tests.support.paths import RUN


def rank_file(directory, rank: str, run: str = RUN, suffix: str = ".prom") -> Path:
    return Path(directory) / f"rank-{rank}.{run}{suffix}"


def only_rank_file(directory, rank: str) -> Path:
    """The one rank file of ``rank`` in ``directory``, whatever its run (a training script's own)."""
    found = sorted(Path(directory).glob(f"rank-{rank}.*.prom"))
    assert len(found) == 1, found
    return found[0]
