"""The source line of each CPU-fallback operator, found by watching one step (opt-in: ``fallback_sites``).

A fallback runs in C++ (torch_xla's boxed fallback for the XLA key) with no Python callback, so the step hook only
learns *that* an operator fell back, from torch_xla's counters. When a step marker finds an operator it has not
named yet, the next step runs under a ``TorchDispatchMode`` that sees every operator call, on the training thread
and on the autograd threads. A call of a wanted operator is named by the innermost user frame; a call from the
backward pass (an autograd thread, which has no Python frames) by the line of the training thread that is waiting
in ``backward()``. The mode is removed at the next step marker.

Why it is off by default: a dispatch mode costs several microseconds per operator call, and pushing one has been
seen to compile the step's graph once more. The step watched is marked, and its compilations are neither new graphs
nor recompilations. Each operator is watched for at most one step.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable

from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode

from ..sites import SiteFinder

MAX_OPS = 100  # operators named; more are not watched


class _Watch(TorchDispatchMode):
    def __init__(self, probe: FallbackProbe):
        super().__init__()
        self._probe = probe

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func._schema.name in self._probe.wanted:
            self._probe._called(func._schema.name)
        return func(*args, **(kwargs or {}))


class FallbackProbe:
    def __init__(
        self,
        sites: SiteFinder,
        on_site: Callable[[str, str, list[str], bool], None],
        on_error: Callable[[BaseException], None],
    ):
        """``on_site(op, location, frames, backward)`` records where an operator was called (any thread; it must not
        raise); ``on_error`` an exporter failure."""
        self._sites = sites
        self._on_site = on_site
        self._on_error = on_error
        self.watched: set[str] = set()  # operators watched for a step already: never again
        self.wanted: frozenset[str] = frozenset()  # operators the current watch looks for
        self._mode: _Watch | None = None
        self._thread = 0
        self._named: set[tuple[str, str]] = set()

    @property
    def active(self) -> bool:
        return self._mode is not None

    def arm(self, operators) -> bool:
        """On the training thread, after a step marker: watch the next step if ``operators`` (names of operators that
        fell back so far) holds one not watched yet. Returns whether it did."""
        new = frozenset(op for op in operators if op not in self.watched)
        if self._mode is not None or not new or len(self.watched) >= MAX_OPS:
            return False
        self.watched |= new
        self.wanted, self._thread, self._named = new, threading.get_ident(), set()
        mode = _Watch(self)
        mode.__enter__()
        self._mode = mode
        return True

    def disarm(self) -> bool:
        """At the next step marker, on the thread that armed: take the mode off. Returns whether the watch ended (a
        dispatch mode the training code pushed above it and kept is left alone, and the watch goes on)."""
        mode = self._mode
        if mode is None:
            return False
        if _get_current_dispatch_mode() is not mode:
            return False
        mode.__exit__(None, None, None)
        self._mode = None
        self.wanted = frozenset()
        return True

    def _called(self, op: str) -> None:
        try:
            thread = threading.get_ident()
            backward = thread != self._thread
            # On the training thread the walk starts here and skips this package's and torch's frames.
            frame = sys._current_frames().get(self._thread) if backward else sys._getframe(1)
            location = self._sites.site(frame)
            if (op, location) in self._named:
                return
            self._named.add((op, location))
            self._on_site(op, location, self._sites.frames(frame), backward)
        except Exception as error:  # noqa: BLE001 (never into the training loop)
            self._on_error(error)
