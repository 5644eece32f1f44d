"""The one way the exporter replaces an attribute of someone else's (a torch_xla binding, a ``Tensor`` method,
``sys.excepthook``) with a wrapper of its own, and puts it back.

- ``install()`` puts ``wrap(original)`` in place, once: a second call does nothing, and neither does a call in a
  forked child of a process that installed (the child inherits the wrapper and the state that undoes it).
- ``undo()`` puts the original back only if the attribute is still our wrapper. Whoever wrapped it after us keeps
  theirs, with ours inside it (its hook makes it do nothing once off); the patch then stays installed, so a later
  ``undo()`` can still restore the original and a later ``install()`` does not wrap twice.
- An attribute the owner inherited (``Tensor.__bool__``, from ``TensorBase``) is deleted again, not copied down.
- Neither raises: a failure goes to ``on_error`` (the hooks count it as the exporter's own, see ``self_metrics``).

One lock serialises every patch. A fork waits for it, so that a child never inherits a patch half made, and the
child gets it free (``fork_safe``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from .. import fork_safe

MARK = "__neuron_exporter_original__"  # on each wrapper: what it wraps, and that it is the exporter's
MISSING = object()

_lock = fork_safe.RLock()


def _before_fork() -> None:
    _lock.acquire()


def _after_fork_in_parent() -> None:
    _lock.release()


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent)  # the child's is renewed (fork_safe)


class Patch:
    def __init__(self, owner: Any, name: str, wrap: Callable[[Any], Any], on_error: Callable[[BaseException], None]):
        """``wrap(original)`` returns the wrapper that replaces ``owner.name``; ``on_error(error)`` is told of a
        failure to install or undo (it must not raise)."""
        self.owner = owner
        self.name = name
        self._wrap = wrap
        self._on_error = on_error
        self.wrapper: Any = None
        self._own: Any = MISSING  # the owner's own value before us, MISSING if inherited

    @property
    def installed(self) -> bool:
        return self.wrapper is not None

    def install(self) -> bool:
        """Put the wrapper in place, unless it is already; whether it is in place."""
        try:
            with _lock:
                if self.wrapper is None:
                    original = getattr(self.owner, self.name)
                    if hasattr(original, MARK):
                        raise RuntimeError(f"{self.name} is already wrapped by neuron-exporter")
                    wrapper = self._wrap(original)
                    setattr(wrapper, MARK, original)
                    own = _own(self.owner, self.name)
                    setattr(self.owner, self.name, wrapper)
                    self.wrapper, self._own = wrapper, own
            return True
        except Exception as error:  # noqa: BLE001 (never into the caller: torch's import, dynamo, the loop)
            self._report(error)
            return False

    def undo(self) -> bool:
        """Put the original back if the attribute is still our wrapper; whether the original is back."""
        try:
            with _lock:
                if self.wrapper is None:
                    return True
                if _own(self.owner, self.name) is not self.wrapper:
                    return False  # wrapped after us: unwrapping theirs would drop their hook
                if self._own is MISSING:
                    delattr(self.owner, self.name)
                else:
                    setattr(self.owner, self.name, self._own)
                self.wrapper, self._own = None, MISSING
            return True
        except Exception as error:  # noqa: BLE001
            self._report(error)
            return False

    def _report(self, error: BaseException) -> None:
        try:
            self._on_error(error)
        except Exception:  # noqa: BLE001 (a failing reporter must not turn a failed patch into a crash)
            pass


def _own(owner: Any, name: str) -> Any:
    """``owner``'s own value of ``name``, not one it inherits (MISSING then)."""
    try:
        return vars(owner).get(name, MISSING)
    except TypeError:  # no __dict__: whatever it answers is its own
        return getattr(owner, name, MISSING)
