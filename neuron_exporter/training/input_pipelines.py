"""The input pipelines' entry points, where a thread takes its batches, wrapped once per process for every source
that listens: the time phases (the ``data`` phase) and the throughput (samples and tokens).

The reach: ``next()`` on a DataLoader's iterator (every iterator, single- and multi-process, takes its batches through
the base class's ``__next__``), ``iter()`` of a DataLoader (its workers start there), and torch_xla's per-device loader
(``MpDeviceLoader`` hands the training thread its batches there, and runs a step marker in it). A plain generator or
any other iterable the loop draws from is not seen: Python's ``next()`` cannot be wrapped without a cost on every call
of every iterator.

One wrapper per entry point, shared: ``Patch`` refuses a second wrapper of the exporter's on an attribute, and two
stacked ones could not be taken off in any order the sources stop in. The wrapper calls each listener of its kind
as the thread goes in (``entered``) and as it comes out (``left``, with the batch), in the reverse order; with no
listener it only calls the original. The entry points are wrapped once the first listener is added (each as its
module is imported) and put back when the last one is removed.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any, Protocol

from .. import fork_safe
from .dynamo_skip import standing_in
from .import_watch import after_import, forget
from .patching import Patch

log = logging.getLogger("neuron_exporter")

BATCH, START = "batch", "start"  # an entry point that returns a batch; one that starts a pipeline (returns none)
NO_BATCH = object()  # what ``left`` is given when the entry point returns no batch, or raised

# module -> [(class inside the module, method, kind)]
ENTRY_POINTS: dict[str, list[tuple[str, str, str]]] = {
    "torch.utils.data.dataloader": [("_BaseDataLoaderIter", "__next__", BATCH), ("DataLoader", "__iter__", START)],
    "torch_xla.distributed.parallel_loader": [("PerDeviceLoader", "__next__", BATCH)],
}


class Listener(Protocol):
    def entered(self) -> Any:
        """The calling thread enters an entry point; what ``left`` is given back. Never raises."""

    def left(self, token: Any, batch: object) -> None:
        """The calling thread leaves it: ``token`` is what ``entered`` returned, ``batch`` what the entry point
        returned (``NO_BATCH`` if it returns none or raised). Never raises."""


class _Kind:
    """The listeners of one kind of entry point: a new tuple at each change, which the wrappers read once a call."""

    __slots__ = ("batches", "listeners")

    def __init__(self, batches: bool):
        self.batches = batches
        self.listeners: tuple[Listener, ...] = ()


class InputPipelines:
    def __init__(self) -> None:
        self._lock = fork_safe.Lock()
        self._kinds = {BATCH: _Kind(batches=True), START: _Kind(batches=False)}
        self._listeners: list[tuple[Listener, tuple[str, ...], Callable[[BaseException], None]]] = []
        self._patches: dict[tuple[str, str, str], Patch] = {}
        self._watching: dict[str, Callable[[], None]] = {}

    def add(self, listener: Listener, kinds: tuple[str, ...], on_error: Callable[[BaseException], None]) -> None:
        """Call ``listener`` at the entry points of ``kinds``; a failure to wrap one goes to ``on_error`` (that of
        the first listener still added)."""
        with self._lock:
            if any(added is listener for added, _, _ in self._listeners):
                return
            self._listeners.append((listener, kinds, on_error))
            self._rebuild()
            watch = not self._watching
            if watch:
                self._watching = {module: _after(self._wrap_module, module) for module in ENTRY_POINTS}
        if watch:
            for module, wrap in self._watching.items():
                after_import(module, wrap)  # now, if imported: outside the lock, which the wrapping takes

    def remove(self, listener: Listener) -> None:
        """Stop calling ``listener``; the last one out puts the entry points back (one someone wrapped after us
        stays wrapped, calling nobody, until it can be put back)."""
        with self._lock:
            self._listeners = [entry for entry in self._listeners if entry[0] is not listener]
            self._rebuild()
            if self._listeners:
                return
            watching, self._watching = self._watching, {}
        for wrap in watching.values():
            forget(wrap)
        for patch in list(self._patches.values()):
            patch.undo()

    def _rebuild(self) -> None:
        for name, kind in self._kinds.items():
            kind.listeners = tuple(listener for listener, kinds, _ in self._listeners if name in kinds)

    def _report(self, error: BaseException) -> None:
        listeners = self._listeners
        if listeners:
            listeners[0][2](error)
        else:
            log.debug("neuron-exporter: an input pipeline's entry point: %s", error)

    def _wrap_module(self, name: str) -> None:
        module = sys.modules.get(name)
        with self._lock:
            if not self._listeners:
                return
            for owner_name, attribute, kind in ENTRY_POINTS[name]:
                key = (name, owner_name, attribute)
                patch = self._patches.get(key)
                if patch is None:
                    owner = getattr(module, owner_name, None)
                    if owner is None or not callable(getattr(owner, attribute, None)):
                        continue  # a name this release lacks
                    patch = self._patches[key] = Patch(owner, attribute, _wrapper(self._kinds[kind]), self._report)
                patch.install()


def _after(wrap_module: Callable[[str], None], name: str) -> Callable[[], None]:
    def imported() -> None:
        wrap_module(name)

    return imported


def _wrapper(kind: _Kind) -> Callable[[Callable], Callable]:
    def wrap(original: Callable) -> Callable:
        def entry(*args, **kwargs):
            listeners = kind.listeners
            if not listeners:
                return original(*args, **kwargs)
            tokens = [listener.entered() for listener in listeners]
            batch = NO_BATCH
            try:
                batch = original(*args, **kwargs)
            finally:
                seen = batch if kind.batches else NO_BATCH
                for index in range(len(listeners) - 1, -1, -1):
                    listeners[index].left(tokens[index], seen)
            return batch

        return standing_in(entry, original)

    return wrap


PIPELINES = InputPipelines()  # the process's: one wrapper per entry point, whichever sources listen
