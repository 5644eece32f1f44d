"""The one hook into torch_xla: a wrapper around ``torch_xla._XLAC._xla_step_marker``.

Every Python path that ends a step reaches that binding through ``torch_xla.sync()``: ``xm.mark_step()``,
``torch_xla.step()``/``compile()`` (module-global ``sync``), ``xm.optimizer_step(barrier=True)``, the parallel
loaders, and a ``sync`` imported by name before the hook went in, because ``sync()`` looks the binding up on
the module at every call.
"""

from __future__ import annotations

from collections.abc import Callable

from .dynamo_skip import never_compiled

MARK = "__neuron_exporter_original__"


def _xlac():
    import torch_xla

    return torch_xla._XLAC


class StepHook:
    def __init__(self, make_wrapper: Callable[[Callable, StepHook], Callable]):
        """``make_wrapper(original, hook)`` returns the function that replaces the binding: it calls ``original`` with
        the caller's arguments and returns its result (its exceptions reach the caller unchanged), and while
        ``hook.active`` is False it does nothing else. The owner writes the whole wrapper, so that the step marker
        pays for one Python call, not three."""
        self._make_wrapper = make_wrapper
        self._original: Callable | None = None
        self._wrapper: Callable | None = None
        self.active = False

    @property
    def installed(self) -> bool:
        return self._wrapper is not None

    def install(self) -> None:
        xlac = _xlac()
        original = xlac._xla_step_marker
        if hasattr(original, MARK):
            raise RuntimeError("the neuron-exporter step hook is already installed")
        step_marker = self._make_wrapper(original, self)
        never_compiled(step_marker)
        setattr(step_marker, MARK, original)
        self._original, self._wrapper = original, step_marker
        self.active = True
        xlac._xla_step_marker = step_marker

    def uninstall(self) -> None:
        if self._wrapper is None:
            return
        self.active = False
        xlac = _xlac()
        if xlac._xla_step_marker is self._wrapper:
            xlac._xla_step_marker = self._original
        # else someone wrapped the binding after us; unwrapping theirs would drop their hook: ours stays, inert.
        self._original = self._wrapper = None
