"""The locks of the code that runs in the training process, each renewed in a forked child, all by one mechanism.

A fork copies the process with its locks but only the thread that forked: a lock another thread held at that moment
(a scrape reading the ledger, the spool thread rendering) stays held in the child forever, and the child's training
would hang on it. Every lock of the exporter in the training process is one of these (``Lock()``, ``RLock()``): after
a fork, the child replaces what each of them wraps with a new, free lock. State a child must start afresh is each
owner's own (``after_fork``); the locks are never. The one lock that is not one of these is ``import_watch``'s, which
runs at the interpreter's start and imports nothing Python has not loaded then: it renews itself the same way.
"""

from __future__ import annotations

import os
from _thread import RLock as _new_rlock
from _thread import allocate_lock as _new_lock
from _weakrefset import WeakSet

_every: WeakSet[Lock] = WeakSet()


class Lock:
    """A lock (reentrant with ``reentrant=True``) that a forked child gets free."""

    __slots__ = ("__weakref__", "_lock", "_new", "acquire", "release")

    def __init__(self, reentrant: bool = False):
        self._new = _new_rlock if reentrant else _new_lock
        self._renew()
        _every.add(self)

    def _renew(self) -> None:
        self._lock = self._new()
        self.acquire, self.release = self._lock.acquire, self._lock.release

    def __enter__(self) -> bool:
        return self._lock.acquire()

    def __exit__(self, *exc) -> None:
        self._lock.release()


def RLock() -> Lock:
    return Lock(reentrant=True)


def every_lock() -> list[Lock]:
    """Every lock alive (for tests that hold them all at a fork)."""
    return list(_every)


def _renew_every_lock() -> None:
    for lock in list(_every):
        lock._renew()


os.register_at_fork(after_in_child=_renew_every_lock)
