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
    def __init__(self, before_sync: Callable[[], None], on_sync: Callable[[], None]):
        """``before_sync`` runs before every step marker, ``on_sync`` after it returns; neither may raise (the hook
        does not catch)."""
        self._before_sync = before_sync
        self._on_sync = on_sync
        self._original = None
        self._wrapper = None

    @property
    def installed(self) -> bool:
        return self._wrapper is not None

    def install(self) -> None:
        xlac = _xlac()
        original = xlac._xla_step_marker
        if hasattr(original, MARK):
            raise RuntimeError("the neuron-exporter step hook is already installed")
        hook = self

        def step_marker(*args, **kwargs):
            hook._before_sync()
            result = original(*args, **kwargs)  # its exceptions reach the caller unchanged
            hook._on_sync()
            return result

        never_compiled(step_marker)
        setattr(step_marker, MARK, original)
        self._original, self._wrapper = original, step_marker
        xlac._xla_step_marker = step_marker

    def uninstall(self) -> None:
        if self._wrapper is None:
            return
        xlac = _xlac()
        if xlac._xla_step_marker is self._wrapper:
            xlac._xla_step_marker = self._original
        else:
            # Someone wrapped the binding after us; unwrapping theirs would drop their hook. Go inert instead.
            self._before_sync = self._on_sync = _nothing
        self._original = self._wrapper = None


def _nothing() -> None:
    return None
