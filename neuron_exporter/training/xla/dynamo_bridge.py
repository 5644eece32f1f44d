"""torch_xla's ``torch.compile`` backend (``openxla``) compiles a graph when it first runs, not when dynamo compiles
it: ``torch_xla.core.dynamo_bridge.extract_compiled_graph`` traces it, syncs and compiles it with XLA, outside
dynamo's bracket. A backward graph's first run is on autograd's device thread, while the training thread waits in
``backward()``. The wrapper tells the ledger of it as a compilation, on whichever thread it runs (the ledger gives
autograd's thread's to the training thread)."""

from __future__ import annotations

import sys
from collections.abc import Callable

from ..dynamo_skip import never_traced
from ..import_watch import after_import, forget
from ..patching import Patch
from ..time_phases import TimePhases

MODULE = "torch_xla.core.dynamo_bridge"  # what torch's openxla backend calls, by attribute, at a graph's first run
FUNCTION = "extract_compiled_graph"


class BridgeCompilations:
    def __init__(self, phases: Callable[[], TimePhases], on_error: Callable[[BaseException], None]):
        self._phases = phases
        self._on_error = on_error
        self._patch: Patch | None = None

    def install(self) -> None:
        after_import(MODULE, self._wrap)

    def uninstall(self) -> None:
        forget(self._wrap)
        if self._patch is not None:
            self._patch.undo()

    def _wrap(self) -> None:
        module = sys.modules.get(MODULE)
        if module is None or not callable(getattr(module, FUNCTION, None)):
            return
        if self._patch is None:
            self._patch = Patch(module, FUNCTION, self._wrapper, self._on_error)
        self._patch.install()

    def _wrapper(self, original):
        phases = self._phases

        def extract_compiled_graph(*args, **kwargs):
            ledger = phases()
            ledger.compile_started()
            try:
                return original(*args, **kwargs)
            finally:
                ledger.compile_ended()

        never_traced(extract_compiled_graph)
        return extract_compiled_graph
