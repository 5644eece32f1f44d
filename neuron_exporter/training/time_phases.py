"""Where the training thread's time goes: ``training_time_seconds_total{phase}``, the ledger behind goodput.

The phases partition the training thread's wall time from the process's start:

- ``data``, ``checkpoint``, ``host_sync``: the thread is inside an input pipeline's ``next()``, a save or load of a
  checkpoint, a host read of device data: spans its hooks open and close (``open``/``close``, or ``phase()``);
- ``compile``: compiling, wherever it happens: dynamo's compilations are bracketed (``compile_started``/``ended``,
  told on the compiling thread); a device's own compilations (torch_xla's graphs, TorchNeuron's kernels) are told
  by the code that ran them, as a call (``device_call``) that reports, at its end, how long it compiled, and that the
  ledger can ask while it runs whether it is compiling now; either comes out of the phase it happened in;
- the rest, the *base*: ``startup`` until the first optimizer step (the first step traces, compiles and warms up;
  and a process that never steps never trained), ``step`` from there to each optimizer step, ``other`` after the
  last one (known when the process ends or detaches).

Each thread has a lane of its own: its open phase, its compilations, its device call. A span or a compilation is
closed on the lane that opened it, whatever happens on other threads, so nothing is left open. The figures served are
one lane's, the training thread's: the first thread that steps an optimizer (until then, the last that made one, or
the main thread), for good while it lives; a thread that steps after it has ended takes over. Other threads' lanes
count nothing. A compilation on a thread Python did not start (autograd's device thread, which compiles a backward
graph lazily while the training thread waits in ``backward()``) is the training thread's.

Nested phases count once: a compilation is ``compile`` wherever it happens; anything else counts in the outermost
phase. A phase is counted when it ends, the base when an optimizer steps (before the first step, at every read: it
can only be start-up; and at the end), so what is served never changes once served: the counters only grow, and
never by themselves. Compiling is the exception: it is counted as it goes, at every read, so a first compile of half
an hour shows while it runs. At an optimizer step the phases sum to the wall time since the process started.

One ledger per process (``process_ledger``): ``detach()`` finishes it, a later ``attach()`` resumes it, and the time
in between is the base's (``other``, or ``startup`` before any step).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

from ..catalogue import TRAINING_TIME

PHASES = TRAINING_TIME.values_of("phase")  # written in the catalogue only
STARTUP, DATA, COMPILE, HOST_SYNC, CHECKPOINT, STEP, OTHER, RECOVERY = PHASES
BADPUT = tuple(phase for phase in PHASES if phase != STEP)


class Lane:
    """One thread's state in the ledger."""

    __slots__ = ("compile_start", "compiling", "depth", "phase", "phase_start", "phase_taken", "thread")

    def __init__(self, thread: int):
        self.thread = thread
        self.phase: str | None = None  # the outermost open phase
        self.phase_start = 0.0  # from when it is not counted yet
        self.phase_taken = 0.0  # seconds of compile inside it, counted already
        self.depth = 0  # phases open, nested
        self.compiling = 0  # dynamo's compilations open on it (autograd's thread's too, for the training lane)
        self.compile_start = 0.0  # from when the open compilation is not counted yet

    @property
    def idle(self) -> bool:
        return not self.depth and not self.compiling


class DeviceCall:
    """A call into a device that may compile (a step marker, a host read, the stretch between optimizer steps)."""

    __slots__ = ("lane", "probe", "seen", "served", "start", "token")

    def __init__(self, lane: Lane, start: float, probe: Callable[[DeviceCall], bool] | None, token: object):
        self.lane = lane
        self.start = start
        self.probe = probe  # asked at reads, from any thread: whether it is compiling now (never raises)
        self.token = token  # the source's own note of the call (its compile counter before it)
        self.seen: float | None = None  # when a read last saw it compiling
        self.served = 0.0  # of its compilation, counted already


class TimePhases:
    def __init__(self, process_start: float, clock: Callable[[], float] = time.perf_counter):
        """``process_start``: when the process started, on ``clock``'s scale (what came before this ledger is
        ``startup``)."""
        self._clock = clock
        # A plain lock, on the hot path: a forked child never uses this ledger, it gets a new one (process_ledger).
        self._lock = threading.Lock()
        self.totals = dict.fromkeys(PHASES, 0.0)
        now = clock()
        self.totals[STARTUP] = max(0.0, now - process_start)
        main = threading.main_thread()
        self._lanes: dict[int, Lane] = {}  # threads with something open, and the training thread's
        self._borrowed: dict[int, Lane] = {}  # a thread Python did not start -> the lane its compilation is for
        self._calls: dict[int, DeviceCall] = {}  # thread -> the device call it is in that a read can ask about
        self.training = self._lane(main.ident or 0)
        self._training_thread: threading.Thread = main
        self._base_start = now  # the base stretch not yet counted: from here, less what phases took of it
        self._base_taken = 0.0
        self._stepped = False
        self.steps = 0  # optimizer steps of the training thread
        self.finished = False
        self._finished_at = 0.0

    @property
    def thread(self) -> int:
        """The training thread's id."""
        return self.training.thread

    @property
    def training_thread(self) -> threading.Thread:
        """The training thread: the one whose time is served."""
        return self._training_thread

    # -- spans: any thread, counted for the training thread's ---------------------------------------------------
    def open(self, phase: str) -> Lane | None:
        """The calling thread enters ``phase``; the lane to ``close`` when it leaves (None after the end)."""
        if self.finished:
            return None
        thread = threading.get_ident()
        with self._lock:
            lane = self._lanes.get(thread) or self._lane(thread)
            lane.depth += 1
            if lane.depth == 1 and not lane.compiling:
                lane.phase, lane.phase_start, lane.phase_taken = phase, self._clock(), 0.0
            return lane

    def close(self, lane: Lane) -> None:
        with self._lock:
            lane.depth -= 1
            if lane.depth > 0:
                return
            lane.depth = 0
            if lane.phase is not None:
                self._count_phase(lane, self._clock())
                lane.phase = None
            if lane is not self.training:
                self._drop_if_idle(lane)

    def phase(self, phase: str) -> _Span:
        """``with ledger.phase(DATA): ...``"""
        return _Span(self, phase)

    # -- dynamo's compilations, told on the compiling thread ----------------------------------------------------
    def compile_started(self) -> None:
        thread = threading.get_ident()
        with self._lock:
            if self.finished:
                return
            lane = self._lanes.get(thread)
            if lane is None and not _started_by_python(thread):
                lane = self._borrowed[thread] = self.training
            lane = lane or self._lane(thread)
            lane.compiling += 1
            if lane.compiling == 1:
                lane.compile_start = self._clock()

    def compile_ended(self) -> None:
        thread = threading.get_ident()
        with self._lock:
            lane = self._borrowed.pop(thread, None) or self._lanes.get(thread)
            if lane is None or not lane.compiling:  # its start came before the ledger listened
                return
            lane.compiling -= 1
            if not lane.compiling:
                if lane is self.training and not self.finished:
                    self._take_for_compile(lane, self._clock() - lane.compile_start)
                self._drop_if_idle(lane)

    # -- a device's own compilations ----------------------------------------------------------------------------
    def device_call(self, probe: Callable[[DeviceCall], bool] | None = None, token: object = None) -> DeviceCall:
        """The calling thread starts a call into its device; ``device_call_ended`` must follow on the same thread.
        With a ``probe``, reads ask it while the call runs whether it compiles, and count that time at once."""
        thread = threading.get_ident()
        lane = self._lanes.get(thread) or self._lane_locked(thread)
        call = DeviceCall(lane, self._clock(), probe, token)
        if probe is not None:
            self._calls[thread] = call
        return call

    def device_call_ended(self, call: DeviceCall, compiled_seconds: float) -> None:
        """The call ended, having compiled for ``compiled_seconds`` (on the device's clock): counted as ``compile``,
        out of the phase it happened in (nothing, inside dynamo's compilation, which counts itself), less what
        reads counted of it already; never more than the call took."""
        if call.probe is not None:
            self._calls.pop(call.lane.thread, None)
        if compiled_seconds <= call.served:
            if call.lane is not self.training and call.lane.idle:
                self._drop_quietly(call.lane)
            return
        with self._lock:
            lane = call.lane
            if lane is self.training and not self.finished and not lane.compiling:
                self._take_for_compile(lane, min(compiled_seconds, self._clock() - call.start) - call.served)
            call.served = compiled_seconds
            self._drop_if_idle(lane)

    def _device_progress(self, call: DeviceCall | None, compiling: bool, now: float) -> None:
        """A read found the training thread's device ``call`` compiling or not: what it compiled since the last read
        that saw it compiling counts now."""
        if call is None or self._calls.get(call.lane.thread) is not call or call.lane is not self.training:
            return  # none, or it ended meanwhile (its end counted it), or not the training thread's
        if not compiling:
            call.seen = None
            return
        if call.seen is not None:
            call.served += self._take_for_compile(call.lane, now - call.seen)
        call.seen = now

    # -- optimizers: the base, and which thread trains ----------------------------------------------------------
    def optimizer_created(self) -> None:
        """Before the first optimizer step, the thread that made an optimizer is the one that trains."""
        if self._stepped:
            return
        with self._lock:
            if not (self.finished or self._stepped):
                self._claim(threading.current_thread(), STARTUP)

    def optimizer_stepped(self) -> None:
        """An optimizer stepped: the base so far was a training step (start-up, up to the first), if this is the
        training thread."""
        with self._lock:
            if self.finished:
                return
            base = STEP if self._stepped else STARTUP
            thread = threading.current_thread()
            if thread is not self._training_thread:
                if self._stepped and self._training_thread.is_alive():
                    return  # another thread that trains: the first one's time is served
                self._claim(thread, base)
            self._stepped = True
            self.steps += 1
            self._count_base(base)

    def _claim(self, thread: threading.Thread, base: str) -> None:
        """``thread`` trains from now on: the old training lane is counted up to now (its base as ``base``), and the
        new one's open phase and compilation count from now."""
        if thread is self._training_thread:
            return
        now = self._clock()
        old = self.training
        if old.compiling:
            self._take_for_compile(old, now - old.compile_start)
        self._count_base(base)
        self._training_thread = thread
        self.training = self._lane(thread.ident or 0)
        self._drop_if_idle(old)
        lane = self.training
        lane.phase_start, lane.phase_taken, lane.compile_start = now, 0.0, now
        for borrower, borrowed in list(self._borrowed.items()):
            if borrowed is old:  # autograd's compilation for the old training thread ends in the new lane
                old.compiling -= 1
                lane.compiling += 1
                self._borrowed[borrower] = lane

    # -- the end, and after a detach ---------------------------------------------------------------------------
    def finish(self) -> None:
        """The process ends or detaches: the base since the last optimizer step was ``other`` (``startup`` if none
        stepped); nothing is counted after, until ``resume``."""
        with self._lock:
            if self.finished:
                return
            lane, now = self.training, self._clock()
            if lane.compiling:
                self._take_for_compile(lane, now - lane.compile_start)
            self._count_base(OTHER if self._stepped else STARTUP)
            self.finished, self._finished_at = True, now

    def resume(self) -> None:
        """``attach()`` again after a ``detach()``: the counters go on; the time in between was the base's."""
        with self._lock:
            if not self.finished:
                return
            now = self._clock()
            self.totals[OTHER if self._stepped else STARTUP] += max(0.0, now - self._finished_at)
            self._base_start, self._base_taken = now, 0.0
            for lane in self._lanes.values():
                lane.phase_start, lane.phase_taken, lane.compile_start = now, 0.0, now
            self.finished = False

    def read(self) -> dict[str, float]:
        """The totals so far, with a compilation running now counted up to now; before the first optimizer step, the
        start-up up to now (it can only be start-up)."""
        return self.progress()[0]

    def progress(self) -> tuple[dict[str, float], int]:
        """``read``, and the training thread's optimizer steps counted in it, at once."""
        call = self._calls.get(self.training.thread)
        compiling = call is not None and call.probe is not None and call.probe(call)  # outside the lock: it reads
        with self._lock:
            if not self.finished:
                now = self._clock()
                lane = self.training
                if lane.compiling:
                    self._take_for_compile(lane, now - lane.compile_start)
                    lane.compile_start = now
                else:
                    self._device_progress(call, compiling, now)
                if not self._stepped and lane.phase is None:
                    self._count_base(STARTUP)
            return dict(self.totals), self.steps

    # -- the arithmetic, under the lock -------------------------------------------------------------------------
    def _lane(self, thread: int) -> Lane:
        lane = self._lanes.get(thread)
        if lane is None:
            lane = self._lanes[thread] = Lane(thread)
        return lane

    def _lane_locked(self, thread: int) -> Lane:
        with self._lock:
            return self._lane(thread)

    def _drop_if_idle(self, lane: Lane) -> None:
        if lane is not self.training and lane.idle and lane.thread not in self._calls:
            self._lanes.pop(lane.thread, None)

    def _drop_quietly(self, lane: Lane) -> None:
        with self._lock:
            self._drop_if_idle(lane)

    def _count_phase(self, lane: Lane, now: float) -> None:
        """The open phase of ``lane`` up to ``now`` (the rest counts when it ends), if it is the training lane."""
        if lane is self.training and not self.finished:
            elapsed = max(0.0, now - lane.phase_start)
            self.totals[lane.phase or OTHER] += max(0.0, elapsed - lane.phase_taken)
            self._base_taken += elapsed
        lane.phase_start, lane.phase_taken = now, 0.0

    def _take_for_compile(self, lane: Lane, seconds: float) -> float:
        """``seconds`` of compiling on the training lane, out of its open phase or its base; what was counted."""
        now = self._clock()
        if lane.phase is not None:
            seconds = max(0.0, min(seconds, now - lane.phase_start - lane.phase_taken))
            lane.phase_taken += seconds
        else:
            seconds = max(0.0, min(seconds, now - self._base_start - self._base_taken))
            self._base_taken += seconds
        self.totals[COMPILE] += seconds
        return seconds

    def _count_base(self, phase: str) -> None:
        now = self._clock()
        if self.training.phase is not None:
            self._count_phase(self.training, now)
        self.totals[phase] += max(0.0, now - self._base_start - self._base_taken)
        self._base_start, self._base_taken = now, 0.0


class _Span:
    __slots__ = ("_lane", "_ledger", "_phase")

    def __init__(self, ledger: TimePhases, phase: str):
        self._ledger, self._phase = ledger, phase
        self._lane: Lane | None = None

    def __enter__(self) -> None:
        self._lane = self._ledger.open(self._phase)

    def __exit__(self, *exc) -> None:
        if self._lane is not None:
            self._ledger.close(self._lane)


def _started_by_python(thread: int) -> bool:
    """Whether ``thread`` is one Python started (or the main thread), not one of a library's own (autograd's)."""
    known = threading._active.get(thread)  # type: ignore[attr-defined]
    return known is not None and not isinstance(known, threading._DummyThread)


_process_ledger: TimePhases | None = None


def process_ledger(process_start: float) -> TimePhases:
    """This process's ledger, from ``process_start`` (``time.time()``): made at the first ``attach()``, resumed by
    the next ones; a forked child gets its own."""
    global _process_ledger
    if _process_ledger is None:
        _process_ledger = TimePhases(time.perf_counter() - max(0.0, time.time() - process_start))
    else:
        _process_ledger.resume()
    return _process_ledger


def _after_fork_in_child() -> None:
    global _process_ledger
    _process_ledger = None


os.register_at_fork(after_in_child=_after_fork_in_child)
