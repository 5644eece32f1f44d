"""dynamo's compilations, seen once per process and fanned out to whoever listens (``listen``).

dynamo brackets each compilation with ``torch._dynamo.callback.callback_handler.install_callbacks(trigger,
compile_id)`` (private API, the same from torch 2.9 to 2.14), a context manager entered on the compiling thread: a
frame traced (``DYNAMO``), a backward graph compiled at its first backward (``LAZY_BACKWARD``, on autograd's thread
for a device's tensors). The callbacks it runs are process-wide: they run when the first of all threads starts and
when the last one ends, so a thread that compiles while another does is never told of. So the bracket itself is
wrapped, on the handler object, once however many listen: each thread's outermost compilation is told on that thread
(``started``/``ended`` with a ``Compilation``), one depth count per thread, here only. ``torch._dynamo.reset()``
clears the callbacks' lists, not the bracket: nothing needs registering again.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass

from .. import fork_safe
from .dynamo_skip import never_traced
from .patching import Patch


@dataclass(frozen=True)
class Compilation:
    thread: int
    trigger: str  # DYNAMO, LAZY_BACKWARD, ... ("DYNAMO" where the torch gives none)
    compile_id: object


@dataclass(frozen=True)
class Listener:
    started: Callable[[Compilation], None]  # neither may raise
    ended: Callable[[Compilation], None]


_listeners: tuple[Listener, ...] = ()
_depth: dict[int, int] = {}  # thread -> compilations open on it
_lock = fork_safe.Lock()
_patch: Patch | None = None


def problem() -> str | None:
    """What is wrong with dynamo's compile bracket on this torch, None if nothing."""
    try:
        from torch._dynamo.callback import callback_handler
    except Exception as error:  # noqa: BLE001 (any import failure means: not readable)
        return f"cannot import torch._dynamo.callback: {type(error).__name__}: {error}"
    if not callable(getattr(callback_handler, "install_callbacks", None)):
        return "callback_handler.install_callbacks gone"
    return None


def listen(started: Callable[[Compilation], None], ended: Callable[[Compilation], None], on_error) -> Listener | None:
    """Tell ``started``/``ended`` of every thread's outermost compilation from now on; the listener (for
    ``forget``), None if this torch has no bracket to wrap (``on_error`` is told why it could not go in)."""
    global _listeners, _patch
    if problem() is not None:
        return None
    from torch._dynamo.callback import callback_handler

    listener = Listener(started, ended)
    never_traced(started, ended)
    with _lock:
        if _patch is None:
            _patch = Patch(callback_handler, "install_callbacks", _wrap, on_error)
        if not _patch.install():
            return None
        _listeners = (*_listeners, listener)
    return listener


def forget(listener: Listener | None) -> None:
    """Stop telling ``listener``; the bracket is unwrapped with the last one. Never raises."""
    global _listeners
    with _lock:
        if listener not in _listeners:
            return
        _listeners = tuple(other for other in _listeners if other is not listener)
        if not _listeners and _patch is not None:
            _patch.undo()


def compiling() -> bool:
    """Whether any thread is compiling now."""
    return bool(_depth)


def compiling_on(thread: int) -> bool:
    return thread in _depth


def _wrap(original):
    def install_callbacks(*args, **kwargs):
        return _bracket(original(*args, **kwargs), args, kwargs)

    never_traced(install_callbacks)
    return install_callbacks


@contextlib.contextmanager
def _bracket(inner, args, kwargs):
    thread = threading.get_ident()
    trigger = kwargs.get("trigger", args[0] if args else None)
    compile_id = kwargs.get("compile_id", args[1] if len(args) > 1 else None)
    compilation = Compilation(thread, getattr(trigger, "name", None) or "DYNAMO", compile_id)
    _tell(compilation, started=True)
    try:
        with inner:
            yield
    finally:
        _tell(compilation, started=False)


def _tell(compilation: Compilation, started: bool) -> None:
    thread = compilation.thread
    depth = _depth.get(thread, 0) + (1 if started else -1)
    if depth > 0:
        _depth[thread] = depth
    else:
        _depth.pop(thread, None)
    if (started and depth != 1) or (not started and depth != 0):
        return  # not the thread's outermost compilation
    for listener in _listeners:
        try:
            (listener.started if started else listener.ended)(compilation)
        except Exception:  # noqa: BLE001 (a listener never breaks dynamo; each counts its own failures)
            pass


def _after_fork_in_child() -> None:
    """Only the forking thread goes on in a child: other threads' compilations never end there."""
    thread = threading.get_ident()
    for other in [other for other in _depth if other != thread]:
        _depth.pop(other, None)


os.register_at_fork(after_in_child=_after_fork_in_child)
