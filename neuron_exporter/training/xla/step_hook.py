"""The one hook into torch_xla: a wrapper around ``torch_xla._XLAC._xla_step_marker``.

Every Python path that ends a step reaches that binding through ``torch_xla.sync()``: ``xm.mark_step()``,
``torch_xla.step()``/``compile()`` (module-global ``sync``), ``xm.optimizer_step(barrier=True)``, the parallel
loaders, and a ``sync`` imported by name before the hook went in, because ``sync()`` looks the binding up on
the module at every call.
"""

from __future__ import annotations

from collections.abc import Callable

from ..dynamo_skip import never_traced
from ..patching import Patch


class StepHook:
    def __init__(
        self, make_wrapper: Callable[[Callable, StepHook], Callable], on_error: Callable[[BaseException], None]
    ):
        """``make_wrapper(original, hook)`` returns the function that replaces the binding: it calls ``original`` with
        the caller's arguments and returns its result (its exceptions reach the caller unchanged), and while
        ``hook.active`` is False it does nothing else. The owner writes the whole wrapper, so that the step marker
        pays for one Python call, not three. ``on_error`` is told why the hook could not go in or come out."""
        self._make_wrapper = make_wrapper
        self._on_error = on_error
        self._patch: Patch | None = None
        self.active = False

    @property
    def installed(self) -> bool:
        return self._patch is not None and self._patch.installed

    def install(self) -> bool:
        """Whether the hook is in."""
        if self._patch is None:
            import torch_xla

            self._patch = Patch(torch_xla._XLAC, "_xla_step_marker", self._wrap, self._on_error)
        self.active = self._patch.install()
        return self.active

    def _wrap(self, original: Callable) -> Callable:
        step_marker = self._make_wrapper(original, self)
        never_traced(step_marker)
        return step_marker

    def uninstall(self) -> None:
        self.active = False  # if someone wrapped the binding after us, ours stays inside theirs, doing nothing
        if self._patch is not None:
            self._patch.undo()
