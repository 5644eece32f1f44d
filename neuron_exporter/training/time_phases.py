"""Where the training thread's time goes: ``training_time_seconds_total{phase}``, the ledger behind goodput.

The phases partition the training thread's wall time from the process's start:

- ``data``, ``checkpoint``, ``host_sync``: the thread is inside an input pipeline's ``next()``, a save or load of a
  checkpoint, a host read of device data (the hooks: the time-phases source, and each device's host reads);
- ``compile``: compiling on the thread, wherever it happens: dynamo's compilations are bracketed by its callbacks;
  a device's own compilations (torch_xla's graphs, TorchNeuron's kernels) are told afterwards, in seconds, by the
  code that ran them, and taken out of the phase they happened in;
- the rest, the *base*: ``startup`` until the first optimizer is made (or steps), ``step`` from there to each
  optimizer step, ``other`` after the last one (known when the process ends or detaches).

Nested phases count once: a compilation is ``compile`` wherever it happens; anything else counts in the outermost
phase. A phase is counted when it ends, the base when an optimizer steps (or is first made, or at the end), so what
is served never changes once served: the counters only grow. Compiling is the exception: it is counted as it goes,
at every read, so a first compile of half an hour shows while it runs. Dynamo's compilations are bracketed; a device
that tells its compilations afterwards tells, at each read, how long it has seen one run (``device_compiling``), and
its final figure then counts only the rest. At an optimizer step the phases sum to the wall time since the process
started.

Only the training thread's time is counted: the main thread, until an optimizer steps on another thread, which then
is the training thread. Events of other threads (a loader's workers, an asynchronous checkpoint) are ignored.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

STARTUP, DATA, COMPILE, HOST_SYNC, CHECKPOINT, STEP, OTHER = (
    "startup",
    "data",
    "compile",
    "host_sync",
    "checkpoint",
    "step",
    "other",
)
PHASES = (STARTUP, DATA, COMPILE, HOST_SYNC, CHECKPOINT, STEP, OTHER)
BADPUT = tuple(phase for phase in PHASES if phase != STEP)


class TimePhases:
    def __init__(self, process_start: float, clock: Callable[[], float] = time.perf_counter):
        """``process_start``: when the process started, on ``clock``'s scale (what came before this ledger is
        ``startup``)."""
        self._clock = clock
        self._lock = threading.Lock()
        self.totals = dict.fromkeys(PHASES, 0.0)
        self.thread = threading.main_thread().ident
        now = clock()
        self.totals[STARTUP] = max(0.0, now - process_start)
        self._base_start = now  # the base stretch not yet counted: from here, less what phases took of it
        self._base_taken = 0.0
        self._created = False  # an optimizer was made: the base from then on is a training step's
        self._stepped = False
        self._open: str | None = None  # the outermost phase the thread is in, not counted yet
        self._open_start = 0.0
        self._open_taken = 0.0  # seconds of compile inside it
        self._depth = 0
        self._compiling = 0  # depth of dynamo's compilations
        self._compile_start = 0.0
        self._device_call: float | None = None  # the device call a compilation was seen running in (its start)
        self._device_served = 0.0  # of that call's compilation, counted already
        self._device_told: float | None = None  # the last device call told with ``compiled()``
        self.finished = False

    # -- the training thread --------------------------------------------------------------------------------
    def enter(self, phase: str) -> bool:
        """The training thread enters ``phase``; whether this call counts (then ``leave()`` must follow)."""
        if threading.get_ident() != self.thread or self.finished:
            return False
        with self._lock:
            self._depth += 1
            if self._depth == 1 and not self._compiling:
                self._open, self._open_start, self._open_taken = phase, self._clock(), 0.0
        return True

    def leave(self) -> None:
        with self._lock:
            self._depth -= 1
            if self._depth or self._open is None:
                return
            elapsed = self._clock() - self._open_start
            self.totals[self._open] += max(0.0, elapsed - self._open_taken)
            self._base_taken += elapsed
            self._open = None

    def compile_started(self) -> None:
        if threading.get_ident() != self.thread or self.finished:
            return
        with self._lock:
            self._compiling += 1
            if self._compiling == 1:
                self._compile_start = self._clock()

    def compile_ended(self) -> None:
        if threading.get_ident() != self.thread:
            return
        with self._lock:
            if not self._compiling:  # an end whose start came before us (registered mid-compilation)
                return
            self._compiling -= 1
            if not self._compiling:
                self._take_for_compile(self._clock() - self._compile_start)

    def compiled(self, seconds: float, since: float) -> None:
        """A device compiled for ``seconds`` on the training thread, inside a call that began at ``since``
        (``clock()``): counted as ``compile``, out of the phase it happened in (or nothing, inside dynamo's), less
        what ``device_compiling`` counted of it already."""
        if threading.get_ident() != self.thread or self.finished:
            return
        with self._lock:
            served = self._device_served if self._device_call == since else 0.0
            self._device_call, self._device_served, self._device_told = None, 0.0, since
            if not self._compiling and seconds > served:
                self._take_for_compile(min(seconds, self._clock() - since) - served)

    def device_compiling(self, thread: int, call: float, start: float, end: float) -> None:
        """Any thread: a device's call that began at ``call`` on ``thread``, still running, was seen compiling from
        ``start`` to ``end`` (``clock()``): counted as ``compile`` now; ``compiled()`` for that call counts the rest."""
        with self._lock:
            if thread != self.thread or self.finished or self._compiling or call == self._device_told:
                return  # not the training thread's; or dynamo's compilation, which counts itself; or told already
            if self._device_call != call:
                self._device_call, self._device_served = call, 0.0
            self._device_served += self._take_for_compile(end - start)

    def _take_for_compile(self, seconds: float) -> float:
        if self._open is not None:
            seconds = min(seconds, self._clock() - self._open_start - self._open_taken)
            self._open_taken += max(0.0, seconds)
        else:
            seconds = min(seconds, self._clock() - self._base_start - self._base_taken)
        seconds = max(0.0, seconds)
        self.totals[COMPILE] += seconds
        self._base_taken += seconds if self._open is None else 0.0
        return seconds

    def optimizer_created(self) -> None:
        """Before the first optimizer step, what came before an optimizer was made is start-up."""
        if not self._stepped and threading.get_ident() == self.thread:
            with self._lock:
                self._count_base(STARTUP)
                self._created = True

    def optimizer_stepped(self) -> None:
        """An optimizer stepped (on the thread that trains, from now on): the base so far was a training step."""
        with self._lock:
            if self.finished:
                return
            self.thread = threading.get_ident()
            self._stepped = True
            self._count_base(STEP)

    def _count_base(self, phase: str) -> None:
        now = self._clock()
        if self._open is not None:  # counted to here; the rest of the open phase counts when it ends
            elapsed = now - self._open_start
            self.totals[self._open] += max(0.0, elapsed - self._open_taken)
            self._base_taken += elapsed
            self._open_start, self._open_taken = now, 0.0
        self.totals[phase] += max(0.0, now - self._base_start - self._base_taken)
        self._base_start, self._base_taken = now, 0.0

    # -- any thread -------------------------------------------------------------------------------------------
    def finish(self) -> None:
        """The process ends or detaches: the base since the last optimizer step was ``other`` (``startup`` if none
        stepped); nothing is counted after."""
        with self._lock:
            if self.finished:
                return
            if self._open is not None:
                self._depth = 0
                elapsed = self._clock() - self._open_start
                self.totals[self._open] += max(0.0, elapsed - self._open_taken)
                self._base_taken += elapsed
                self._open = None
            self._count_base(OTHER if self._stepped else STARTUP)
            self.finished = True

    def read(self) -> dict[str, float]:
        """The totals so far, with dynamo's compilation up to now; before any optimizer, the start-up up to now (it
        can only be start-up)."""
        with self._lock:
            if self._compiling and not self.finished:
                now = self._clock()
                self._take_for_compile(now - self._compile_start)
                self._compile_start = now
            if not (self._created or self._stepped or self.finished) and self._open is None:
                self._count_base(STARTUP)
            return dict(self.totals)
