"""torch.compile (dynamo): compilations, recompilations and the guard that failed, functions that hit the recompile
limit, and graph breaks with their reason, each by source line, from torch's own records.

Whatever the backend (inductor, aot_eager, eager, torch_xla's openxla, a vendor's), dynamo records:

- one *compilation record* per frame it compiles, in ``torch._dynamo.utils._compilation_metrics`` (a ring of 64):
  its compile id, the compiled function's code (file, first line), the failed guard that made it a recompilation
  (``tensor 'x' size mismatch at index 0. expected 4, actual 5``), a failure when the function has recompiled too
  often and runs eagerly from then on, and the time spent. The ring is read at the start and end of every
  compilation (dynamo's compile callbacks; the end callback fires before that compilation's record is added), after
  the first optimizer step that follows a compilation, and at scrape time; each record is taken once, by its
  compile id.
- a call of ``log_graph_break`` (``torch._dynamo.symbolic_convert``) for every graph break it finds while tracing,
  with the reason and the user's stack: wrapped here, so it costs something only while dynamo compiles.

Nothing here runs per operator or per call of a compiled function. These are private APIs of torch, and they
change: each is probed before it is read (``probe_records``, ``probe_callbacks``, ``probe_graph_breaks``), and
``log_graph_break``, whose shape changed twice, is read by an adapter per known shape (``BREAK_SHAPES``). Checked
against the source of every torch from 2.9.0 to 2.14.1 and tested on 2.9.0 and 2.14.1. When a probe fails, what
the other APIs give is still counted (without the records: compilations and their time from the compile
callbacks, without lines), one log line says what is not, and ``neuron_exporter_torch_compile_readable`` shows it.

The modules: ``probes`` (the private APIs and what each lets it count), ``reasons`` (failed guards and graph-break
reasons reduced to bounded classes), ``records`` (what is kept per function and per graph-break site), ``source``
(the reading), ``families`` and ``diagnosis`` (what a scrape and ``/diagnosis`` show).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..source import SourceKind

if TYPE_CHECKING:
    from ..source import Source, Sources


def _start(sources: Sources) -> Source:
    from .source import TorchCompileSource

    return TorchCompileSource(sources.options.max_site_series, stats=sources.stats)


SOURCE = SourceKind("torch_compile", "torch._dynamo", _start)
