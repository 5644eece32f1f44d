"""Where the training thread's time goes (``training_time_seconds_total{phase}``): the entry points of input
pipelines and checkpoints, and dynamo's compilations, timed into the process's ledger (``time_phases``), which the
other sources feed too (host reads, a device's compilations)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..source import SourceKind

if TYPE_CHECKING:
    from ..source import Source, Sources


def _start(sources: Sources) -> Source:
    from .source import TimePhasesSource

    return TimePhasesSource(sources)


SOURCE = SourceKind("time_phases", "torch", _start)
