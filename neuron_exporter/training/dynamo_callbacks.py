"""dynamo's compile callbacks, ``torch._dynamo.callback.callback_handler`` (private API, the same from torch 2.9 to
2.14): registered here only.

``start(args)`` runs when dynamo starts compiling a frame, ``end(args)`` when it is done (before that compilation's
record is added), on the compiling thread. ``torch._dynamo.reset()`` drops every callback
(``callback_handler.clear()``): removing one that is gone already is not an error, and ``restore()`` registers again
those it dropped, right after ``clear()`` (which is wrapped while any pair is registered: a compilation right after a
reset is seen) and at cheap moments (an optimizer created, a scrape) where that wrapper could not go in.
"""

from __future__ import annotations

import contextlib
import sys
import weakref
from collections.abc import Callable

from .dynamo_skip import never_compiled
from .patching import Patch

METHODS = ("register_start_callback", "register_end_callback", "remove_start_callback", "remove_end_callback")

_registered: weakref.WeakSet[CompileCallbacks] = weakref.WeakSet()
_clear: Patch | None = None  # callback_handler.clear, wrapped to restore() right after it


def problem() -> str | None:
    """What is wrong with the compile callbacks on this torch, None if nothing."""
    try:
        from torch._dynamo.callback import callback_handler
    except Exception as error:  # noqa: BLE001 (any import failure means: not readable)
        return f"cannot import torch._dynamo.callback: {type(error).__name__}: {error}"
    gone = [name for name in METHODS if not callable(getattr(callback_handler, name, None))]
    return f"callback_handler.{', '.join(gone)} gone" if gone else None


def restore() -> None:
    """Register again every registered pair that ``torch._dynamo.reset()`` dropped. Cheap, never raises."""
    if "torch._dynamo.callback" not in sys.modules:
        return
    try:
        for callbacks in list(_registered):
            callbacks.register()
    except Exception:  # noqa: BLE001 (never into the caller; each register() reports its own errors)
        pass


def _restore_after_clear(callback_handler, on_error: Callable[[BaseException], None]) -> None:
    global _clear
    if _clear is None:

        def wrap(original):
            def clear(*args, **kwargs):
                result = original(*args, **kwargs)
                restore()
                return result

            return clear

        _clear = Patch(callback_handler, "clear", wrap, on_error)
    _clear.install()


class CompileCallbacks:
    def __init__(self, start: Callable, end: Callable, on_error: Callable[[BaseException], None]):
        """``start`` and ``end`` must not raise; ``on_error`` is told why they could not be registered or removed."""
        self._start = start
        self._end = end
        self._on_error = on_error
        self.registered = False

    def register(self) -> bool:
        """Register both, once, if this torch has the callbacks (again if ``torch._dynamo.reset()`` dropped them);
        whether they are registered. Never raises."""
        if self.registered:
            self._register_dropped()
            return self.registered
        if problem() is not None:
            return False
        try:
            from torch._dynamo.callback import callback_handler

            never_compiled(self._start, self._end)
            self.registered = True
            _registered.add(self)
            callback_handler.register_start_callback(self._start)
            callback_handler.register_end_callback(self._end)
            _restore_after_clear(callback_handler, self._on_error)
        except Exception as error:  # noqa: BLE001 (never into the caller)
            self._on_error(error)
            self.remove()
        return self.registered

    def _register_dropped(self) -> None:
        """The ones no longer in the handler's lists (a ``torch._dynamo.reset()``), registered again."""
        try:
            from torch._dynamo.callback import callback_handler

            starts = getattr(callback_handler, "start_callbacks", None)
            ends = getattr(callback_handler, "end_callbacks", None)
            # The end first: a compilation that ends between the two then runs an end without a start (a no-op),
            # never a start without its end.
            if isinstance(ends, list) and self._end not in ends:
                callback_handler.register_end_callback(self._end)
            if isinstance(starts, list) and self._start not in starts:
                callback_handler.register_start_callback(self._start)
        except Exception as error:  # noqa: BLE001
            self._on_error(error)

    def remove(self) -> None:
        """Never raises."""
        if not self.registered:
            return
        self.registered = False
        _registered.discard(self)
        if not _registered and _clear is not None:
            _clear.undo()
        try:
            from torch._dynamo.callback import callback_handler

            with contextlib.suppress(ValueError):
                callback_handler.remove_start_callback(self._start)
            with contextlib.suppress(ValueError):
                callback_handler.remove_end_callback(self._end)
        except Exception as error:  # noqa: BLE001
            self._on_error(error)
