"""TorchNeuron's compilations: the NEFF compile cache (eager per-operator kernels and ``torch.compile`` graphs share
it), the graphs the ``neuron`` backend compiled, and the compiled graphs that failed to run and ran eagerly.

- The cache's statistics (``_get_compilation_cache_stats()``, no device work) are read at scrape time. Hits in memory
  and on disk; a miss is a lookup found in neither (``in_memory_misses - persistent_hits``), which neuronx-cc
  compiles. Which compilations were graphs: the statistics are also read when dynamo starts and ends compiling (its
  compile callbacks; a backward graph compiled at the first backward too), and what changed in between is the
  graphs'; the rest are eager operators' kernels. Nothing is read per operator.
- The graphs: ``torch._dynamo.utils.counters["neuron"]`` (``compiled_graphs``, ``graphs_with_collectives``), read at
  scrape time. ``get_dynamo_metrics()`` has the same and more, but synchronizes the device: never read.
- A graph that fails to run logs "Execution failed: <why>" and "Falling back to original GraphModule execution" on
  the backend's logger: a filter there (letting every record through) counts the second line, with the reason of the
  first. The logger must let warnings through (its default).
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable

from ... import fork_safe
from .. import dynamo_callbacks
from .names import BACKEND_LOGGER, FAILURE_PREFIX, FALLBACK_LINE

MAX_REASONS = 1000
MAX_MESSAGE = 300
REASON_CHARS = 60


def failure_reason(message: str) -> str:
    """A short, bounded class of a failure message: its first line, numbers and hex ids left out, cut short."""
    first = message.strip().splitlines()[0] if message.strip() else "unknown"
    first = re.sub(r"0x[0-9a-fA-F]+|\d+", "N", first)
    return re.sub(r"\s+", " ", first)[:REASON_CHARS].strip() or "unknown"


class CacheWindow:
    """The compile cache's statistics around each dynamo compilation: what changed in between was the graphs'."""

    def __init__(self, read_stats: Callable[[], dict], on_error: Callable[[BaseException], None]):
        self._read = read_stats
        self._on_error = on_error
        self._lock = fork_safe.Lock()
        self._started: dict | None = None
        self.graph: dict[str, float] = {"compilations": 0.0, "compile_ms": 0.0}
        self._listener: dynamo_callbacks.Listener | None = None

    def install(self) -> bool:
        if self._listener is None:
            self._listener = dynamo_callbacks.listen(self._start, self._end, self._on_error)
        return self._listener is not None

    def uninstall(self) -> None:
        dynamo_callbacks.forget(self._listener)
        self._listener = None

    def _start(self, compilation=None) -> None:
        try:
            with self._lock:
                if self._started is None:
                    self._started = self._read()
        except Exception as error:  # noqa: BLE001 (never into dynamo)
            self._on_error(error)

    def _end(self, compilation=None) -> None:
        """The window closes when no thread compiles any more: the statistics are the process's."""
        if dynamo_callbacks.compiling():
            return
        try:
            with self._lock:
                started, self._started = self._started, None
                if started is None:
                    return
                now = self._read()
                self.graph["compilations"] += _delta(now, started, "total_compilations")
                self.graph["compile_ms"] += _delta(now, started, "total_compilation_time_ms")
        except Exception as error:  # noqa: BLE001
            self._on_error(error)

    def read(self) -> tuple[dict, dict[str, float]]:
        """The cache's statistics now and the graphs' part of them, read together: with an open window's changes so
        far (a scrape during a compilation), so the graphs' part never moves back to the eager operators'."""
        with self._lock:
            stats = self._read()
            graph = dict(self.graph)
            if self._started is not None:
                graph["compilations"] += _delta(stats, self._started, "total_compilations")
                graph["compile_ms"] += _delta(stats, self._started, "total_compilation_time_ms")
            return stats, graph

    def clear(self) -> None:
        self._started = None
        self.graph = {"compilations": 0.0, "compile_ms": 0.0}


def _delta(now: dict, before: dict, key: str) -> float:
    return max(0.0, float(now.get(key) or 0) - float(before.get(key) or 0))


class GraphFallbacks:
    """Counts the backend's "Falling back to original GraphModule execution" lines, by the reason logged before.

    A filter of the backend's logger that lets every record through, not a handler: a handler there would stop
    ``logging.lastResort`` from printing TorchNeuron's own warnings in a process without logging set up."""

    def __init__(self):
        self.counts: dict[str, int] = {}
        self.messages: dict[str, str] = {}  # reason -> the last full message
        self._lock = fork_safe.Lock()
        self._local = threading.local()
        self._logger: logging.Logger | None = None

    def install(self) -> bool:
        self._logger = logging.getLogger(BACKEND_LOGGER)
        if self not in self._logger.filters:
            self._logger.addFilter(self)
        return True

    def uninstall(self) -> None:
        if self._logger is not None:
            self._logger.removeFilter(self)

    def filter(self, record: logging.LogRecord) -> bool:
        """Counts ``record``; always True (the record goes on as without the exporter)."""
        try:
            message = record.getMessage()
            if message.startswith(FAILURE_PREFIX):
                self._local.failure = message[len(FAILURE_PREFIX) :][:MAX_MESSAGE]
            elif message.startswith(FALLBACK_LINE):
                failure = getattr(self._local, "failure", None) or "unknown"
                self._local.failure = None
                reason = failure_reason(failure)
                with self._lock:
                    if reason not in self.counts and len(self.counts) >= MAX_REASONS:
                        reason = "other"
                    self.counts[reason] = self.counts.get(reason, 0) + 1
                    self.messages[reason] = failure
        except Exception:  # noqa: BLE001 (a filter never raises into the user's logging)
            pass
        return True

    def snapshot(self) -> tuple[dict[str, int], dict[str, str]]:
        with self._lock:
            return dict(self.counts), dict(self.messages)

    def clear(self) -> None:
        self.counts, self.messages = {}, {}
