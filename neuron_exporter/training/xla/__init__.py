"""The torch_xla source: step markers, host reads, uploads and CPU fallbacks of a process that runs on an XLA device
(``source``), started once torch_xla is imported. Its parts: the step-marker hook (``step_hook``), torch_xla's counters
(``reader``), the per-step arithmetic (``step_tracker``), the opt-in fallback probe (``fallback_probe``) and the
families (``families``). Host reads and sites use the shared ``host_reads``, ``sites`` and ``attribution``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..source import SourceKind

if TYPE_CHECKING:
    from ..source import Source, Sources


def _start(sources: Sources) -> Source:
    from .source import XlaSource

    return XlaSource(sources.options, sources.stats, lambda: sources.phases)


SOURCE = SourceKind("xla", "torch_xla", _start)
