"""Per-step arithmetic: which syncs are steps, graphs per step, fragmentation; events handed to ``Attribution``.

Pure logic: it is fed the process-wide compile counters after every sync and knows nothing of torch_xla.
A graph that runs, whether at a sync or cut off early by ``.item()`` or a CPU fallback, passes through the
compile cache lookup, so CachedCompile + UncachedCompile counts graphs exactly and synchronously.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple

from ... import fork_safe
from ..histogram import STEP_DURATION_BUCKETS, Histogram

GRAPHS_PER_STEP_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, float("inf"))
FLUSH_EVERY = 64  # events recorded before the training thread accounts them itself
# Steps held back while no optimizer exists: setup (a broadcast of the initial weights, a checkpoint load) if one
# turns up, steps of a process that trains without one (inference, custom updates) once this many have passed.
SETUP_MARKERS, SETUP_SECONDS = 8, 60.0


# Events, kept in the order they happened until they are accounted (``StepTracker.pending``). Each is built in one
# place: a step marker and a host read by the wrappers of ``source``, the others here.
class Sync(NamedTuple):
    """A step marker: the compile counters (graphs run = CachedCompile + UncachedCompile, and UncachedCompile) before
    and after it, perf_counter() when it ended, what its rare path found (``extra``: see ``Attribution.step_marker``)
    and the optimizer steps since the marker before."""

    graphs_before: int
    compiles_before: int
    graphs: int
    compiles: int
    end: float
    extra: tuple | None
    optimizer_steps: int


class Read(NamedTuple):
    """A host read (see ``Attribution.host_read``, which takes these fields in this order)."""

    cause: str
    location: str
    frames: list[str] | None  # None when the site is known already
    graphs: int
    compiles: int
    traits: tuple


class Upload(NamedTuple):
    location: str
    shapes: tuple


class OptimizerCreated(NamedTuple):
    time: float


class Probe(NamedTuple):
    """The fallback probe starts (after a marker) or stops (after the next one) watching a step."""

    watching: bool


# ``new_event(Sync, (...))`` is ``Sync(...)`` without the Python call of a NamedTuple's ``__new__``: the step marker and
# host-read wrappers build their events with it, at the cost of a plain tuple.
new_event = tuple.__new__


@dataclass
class StepState:
    """What the collector exports; a copy taken under the tracker's lock."""

    syncs: int = 0
    markers: int = 0  # step markers that ran at least one graph
    steps: int = 0
    fragmented_steps: int = 0
    optimizer_steps: bool = False  # steps are training steps (optimizer steps), not step markers
    last_step_end: float | None = None  # time.perf_counter() at the last step end
    step_duration: Histogram = field(default_factory=lambda: Histogram(STEP_DURATION_BUCKETS))
    graphs_per_step: Histogram = field(default_factory=lambda: Histogram(GRAPHS_PER_STEP_BUCKETS))


class StepTracker:
    """Which step markers end a step, and what each step ran.

    A step is what the user counts. Once the process has made (or stepped) a ``torch.optim`` optimizer, a step is
    a training step: it ends at the first step marker that runs a graph after an optimizer step, so gradient
    accumulation with a marker per micro-batch, eval loops and step closures do not count as steps. Without one
    (inference, custom updates), a step is a step marker that ran a graph. Until one of the two is known, such
    markers are held back: dropped as setup when an optimizer turns up, counted (late, with their own durations)
    once SETUP_MARKERS of them or SETUP_SECONDS have passed with none, or when the process ends. Counters only grow.

    A graph that runs between two step markers is a *graph cut*: something (``.item()``, a print, a CPU
    fallback) needed a value before the step ended. A step with a cut is fragmented.
    """

    def __init__(
        self, warmup_steps: int, graphs_seen: int, compiles_seen: int, attribution=None, clock=time.perf_counter
    ):
        """``graphs_seen``/``compiles_seen``: the counters at attach time, so earlier work is not a step.
        ``attribution`` (an ``Attribution``) is told of markers, host reads and uploads in the order they happened,
        as they are accounted. ``clock``: what the markers' times are read with."""
        self.warmup_steps = warmup_steps
        self._clock = clock
        self.attribution = attribution
        self._graphs = graphs_seen
        self._compiles = compiles_seen
        self._state = StepState()
        self._lock = fork_safe.Lock()
        # Markers, optimizer events, host reads and uploads as they happen, accounted later in a batch: right after a
        # graph ran the CPU caches are cold, and every line there costs the training thread several times what it
        # costs a few events later. Appending to a deque is atomic, so readers on other threads can flush. The owner's
        # step marker and host-read wrappers append Sync and Read events here themselves and call ``flush()`` once
        # FLUSH_EVERY are pending: a Python call less on the hottest path.
        self.pending: deque = deque()
        # Optimizer steps (any torch.optim optimizer, on any thread) since the last recorded marker, which carries
        # them: whether an optimizer stepped between two markers is all that matters. The owner's optimizer hook adds
        # to it directly, the cheapest thing it can do on the training thread.
        self.optimizer_steps = 0
        self._optimizer_stepped = False  # since the last step end
        self._held: list[tuple[int, int, float]] | None = []  # (graphs, cuts, end) of steps that may be setup
        self._first_start = clock()  # where the first training step starts: attach, or the optimizer's creation
        self._last_marker_end: float | None = None
        self._step_graphs = 0
        self._step_cuts = 0

    # -- the training thread: record only --------------------------------------------------------------------
    def on_optimizer_created(self) -> None:
        """A ``torch.optim`` optimizer was made: from now on, steps are training steps, the first timed from now."""
        self.pending.append(OptimizerCreated(self._clock()))

    def on_probe(self, watching: bool) -> None:
        self.pending.append(Probe(watching))

    def on_upload(self, location: str, shapes: tuple) -> None:
        self.record(Upload(location, shapes))

    def record(self, event: tuple) -> None:
        """Keep an event to account (the wrappers of ``source`` inline this)."""
        pending = self.pending
        pending.append(event)
        if len(pending) >= FLUSH_EVERY:
            self.flush()

    # -- accounting -------------------------------------------------------------------------------------------
    def flush(self) -> None:
        """Account every event recorded so far, in order."""
        with self._lock:
            pending, attribution = self.pending, self.attribution
            while pending:
                event = pending.popleft()
                kind = type(event)
                if kind is Sync:
                    if event.optimizer_steps:
                        self._count_training_steps()
                        self._optimizer_stepped = True
                    self._account_sync(event)
                elif kind is OptimizerCreated:
                    if not self._state.optimizer_steps:
                        self._first_start = event.time
                    self._count_training_steps()
                elif attribution is None:
                    continue
                elif kind is Read:
                    attribution.host_read(*event)
                elif kind is Upload:
                    attribution.upload(*event)
                else:
                    attribution.probing = event.watching

    def _count_training_steps(self) -> None:
        if not self._state.optimizer_steps:
            self._state.optimizer_steps = True
            self._held = None  # setup: the markers before the optimizer were no steps
            self._step_graphs = self._step_cuts = 0  # what ran before belongs to no training step

    def _account_sync(self, event: Sync) -> None:
        graphs_before, compiles_before, graphs_total, compiles_total, now, extra, _ = event
        state = self._state
        state.syncs += 1
        # The counters only go down when someone calls met.clear_counters(); count from zero again then.
        graphs, compiles = self._graphs, self._compiles
        cuts = graphs_before - graphs if graphs_before >= graphs else graphs_before
        at_marker = graphs_total - graphs_before if graphs_total >= graphs_before else graphs_total
        self._graphs, self._compiles = graphs_total, compiles_total
        compiled_before = compiles_before - compiles if compiles_before >= compiles else compiles_before
        compiled_at_marker = compiles_total - compiles_before if compiles_total >= compiles_before else compiles_total
        if self.attribution is not None and (cuts or compiled_before or compiled_at_marker or extra is not None):
            self.attribution.step_marker(cuts, compiled_before, at_marker, compiled_at_marker, extra)
        if at_marker:
            state.markers += 1
        if cuts + at_marker:
            self._last_marker_end = now
        self._step_graphs += cuts + at_marker
        self._step_cuts += cuts
        if cuts + at_marker == 0 or (state.optimizer_steps and not self._optimizer_stepped):
            return  # an empty sync, or a marker inside a training step (micro-batch, eval, closure)
        step = (self._step_graphs, self._step_cuts, now)
        self._step_graphs = self._step_cuts = 0
        self._optimizer_stepped = False
        held = self._held
        if held is None or state.optimizer_steps:
            self._count_step(*step)
            return
        held.append(step)  # no optimizer yet: setup, or a process that steps without one
        self._settle(now)

    def _settle(self, now: float | None) -> None:
        """Count the held steps as steps if enough markers or time passed without an optimizer (always if ``now`` is
        None: the process ends)."""
        held = self._held
        if not held or (now is not None and len(held) < SETUP_MARKERS and now - held[0][2] < SETUP_SECONDS):
            return
        self._held = None
        for step in held:
            self._count_step(*step)

    def _count_step(self, graphs: int, cuts: int, end: float) -> None:
        state = self._state
        state.steps += 1
        state.graphs_per_step.observe(graphs)
        if cuts:
            state.fragmented_steps += 1
        start = state.last_step_end
        if start is None and state.optimizer_steps:
            start = self._first_start
        if start is not None:
            state.step_duration.observe(end - start)
        state.last_step_end = end

    @property
    def last_step_end(self) -> float | None:
        """time.perf_counter() at the last step end (no copy of the histograms)."""
        self.flush()
        return self._state.last_step_end

    @property
    def last_active(self) -> float | None:
        """time.perf_counter() at the last step end or, while the first steps are held as possible setup, at the last
        marker that ran a graph: the process trains either way."""
        self.flush()
        state = self._state
        return state.last_step_end if state.last_step_end is not None else self._last_marker_end

    def end(self) -> None:
        """The process stops training: steps still held as possible setup are steps."""
        self.flush()
        with self._lock:
            self._settle(None)

    def state(self) -> StepState:
        self.flush()
        with self._lock:
            self._settle(self._clock())
            state = self._state
            return StepState(
                syncs=state.syncs,
                markers=state.markers,
                steps=state.steps,
                fragmented_steps=state.fragmented_steps,
                optimizer_steps=state.optimizer_steps,
                last_step_end=state.last_step_end,
                step_duration=state.step_duration.copy(),
                graphs_per_step=state.graphs_per_step.copy(),
            )
