"""The torch_xla source: step markers, host reads, uploads and CPU fallbacks of a process that runs on an XLA device.

Started when torch_xla is imported (``import_watch``), never before: a process without torch_xla never loads it.
What runs on the training thread:
- around each step marker, four counter reads and a little arithmetic (``StepHook`` with the wrapper below);
- around each host read of an XLA tensor, four counter reads and its site (``HostReadHook``);
- after a compilation only, the traits of what compiled (``XlaReader.graph_traits``).
Events go to the ``StepTracker``, which owns their format and accounts them in batches; ``Attribution`` keeps the
sites. The families are ``XlaFamilies``'. Nothing here forces a device sync, runs a graph, or raises into the loop.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ...config import Options
from ..attribution import Attribution
from ..host_reads import HostReadHook
from ..rank import rank_labels
from ..self_metrics import SelfStats
from ..sites import UNKNOWN, SiteFinder
from ..source import Source
from ..time_phases import TimePhases
from .families import XlaFamilies
from .reader import CACHED_COMPILE, UNCACHED_COMPILE, XlaReader
from .step_hook import StepHook
from .step_tracker import FLUSH_EVERY, Read, StepState, StepTracker, Sync, new_event

if TYPE_CHECKING:
    from .fallback_probe import FallbackProbe


class XlaSource(Source):
    stats: SelfStats
    device = "xla"  # the steps of an optimizer on the XLA device end at the step marker that runs its graph

    def __init__(self, options: Options, stats: SelfStats, phases: Callable[[], TimePhases]):
        """``phases()``: the process's time ledger, told of the seconds torch_xla compiled on the training thread."""
        self.options = options
        self.stats = stats  # replaced in a forked child
        self.phases = phases
        self.reader = XlaReader()
        self.sites = SiteFinder()
        self.attribution = Attribution()
        counters = self.reader.compile_counters()
        self.tracker = StepTracker(options.warmup_steps, *counters, self.attribution)
        self.families = XlaFamilies(self, options.max_op_series, options.max_site_series)
        self._hook = StepHook(self._step_marker, self.step_error)
        self._host_reads = HostReadHook(
            self._host_read, self.step_error, self.device, on_upload=self._on_upload, phases=phases
        )
        # The step marker or host read the training thread is in: (its thread, start, UncachedCompile before it).
        self._in_call: tuple[int, float, int] | None = None
        self._seen_compiling: tuple[tuple[int, float, int], float] | None = None  # (that call, when last seen so)
        self._seen_lock = threading.Lock()  # reads of the ledger may come from several threads at once
        self._probe: FallbackProbe | None = None
        if options.fallback_sites:
            from .fallback_probe import FallbackProbe

            self._probe = FallbackProbe(self.sites, self._on_fallback_site, self.step_error)
        # Graphs run and compilations as far as the exporter can tell: the counts when the last step marker ended,
        # plus what host reads ran since. A marker that finds more was preceded by a cut no host read explains.
        self._graphs_seen, self._compiles_seen = counters

    # -- life cycle ---------------------------------------------------------------------------------------
    def install(self) -> bool:
        """Whether the step hook went in (if not, nothing did, and the failure is counted and logged)."""
        if not self._hook.install():
            return False
        self._host_reads.install()
        return True

    def uninstall(self) -> None:
        self._hook.uninstall()
        if self._probe is not None:
            self._probe.disarm()
        self._host_reads.uninstall()
        self.tracker.end()

    def after_fork(self, stats: SelfStats) -> None:
        """In a forked child: its own counts from here on; the hooks stay (the training code may run there)."""
        self.stats = stats
        self.attribution = Attribution()
        counters = self.reader.compile_counters()
        self.tracker = StepTracker(self.options.warmup_steps, *counters, self.attribution)
        self._graphs_seen, self._compiles_seen = counters
        self._in_call = self._seen_compiling = None
        self._seen_lock = threading.Lock()  # a reading thread may have held it at the fork: it has no thread here

    # -- what the handle reads ----------------------------------------------------------------------------
    @property
    def last_active(self) -> float | None:
        return self.tracker.last_active

    def parts(self) -> dict:
        return self.families.parts()

    def diagnosis(self, rank: dict) -> None:
        """Its sites, cuts and fallbacks; the steps are its own (those of an optimizer on the XLA device)."""
        rank.update(
            self.attribution.diagnosis(rank_labels(), self.tracker.state().steps, self.reader.fallback_counts())
        )

    def step_counts(self) -> StepState:
        """The training steps of optimizers on the XLA device: they end at its step markers."""
        return self.tracker.state()

    # -- optimizer events ---------------------------------------------------------------------------------
    def on_optimizer_created(self) -> None:
        self.tracker.on_optimizer_created()

    def on_optimizer_step(self, optimizer) -> None:
        self.tracker.optimizer_steps += 1  # the cheapest thing on the training thread; carried by the next marker

    # -- the training thread ------------------------------------------------------------------------------
    def _step_marker(self, original, hook: StepHook):
        """The wrapper of torch_xla's step marker: the compile counters before and after it, one event for the
        tracker, and, rarely, what needs the moment (the marker's line when it compiled, the fallback counters when
        a graph was cut that no host read explains). Written as one function that calls nothing in Python: it runs at
        every step, right after the graph ran, when every extra call costs several times what it costs warm. The
        source's parts are looked up at each call, because a forked child replaces them."""
        source = self
        perf_counter, new, sync_event = time.perf_counter, new_event, Sync  # closure variables: cheaper than globals
        get_ident = threading.get_ident

        def step_marker(*args, **kwargs):
            if not hook.active:
                return original(*args, **kwargs)
            start = perf_counter()
            try:
                value = source.reader.counter_value
                compiles_before = value(UNCACHED_COMPILE) or 0
                graphs_before = (value(CACHED_COMPILE) or 0) + compiles_before
                source._in_call = (get_ident(), start, compiles_before)
            except Exception as error:  # noqa: BLE001 (never into the training loop)
                source.step_error(error)  # this marker is not accounted; one failure is counted
                value = None
            own = perf_counter() - start
            try:
                result = original(*args, **kwargs)  # its exceptions reach the caller unchanged
            finally:
                source._in_call = None
            if value is None:
                return result
            now = perf_counter()
            try:
                compiles = value(UNCACHED_COMPILE) or 0
                graphs = (value(CACHED_COMPILE) or 0) + compiles
                # Graphs run since the last marker that no host read ran: a CPU fallback may have cut them.
                graphs_seen, compiles_seen = source._graphs_seen, source._compiles_seen
                unexplained = graphs_before != graphs_seen
                compiled = compiles != compiles_seen  # at the marker or at a cut no host read explains
                source._graphs_seen, source._compiles_seen = graphs, compiles
                probe = source._probe
                if compiles != compiles_before:
                    source._compiled(compiles - compiles_before, start)
                if compiled or unexplained or probe is not None:
                    extra, fallbacks = source._unusual_sync(
                        compiles_before,
                        compiles,
                        unexplained,
                        (graphs - graphs_seen, compiles - compiles_seen) if compiled else None,
                    )
                else:
                    extra = fallbacks = None
                tracker = source.tracker
                stepped, tracker.optimizer_steps = tracker.optimizer_steps, 0
                pending = tracker.pending  # tracker.record(Sync(...)), inlined
                pending.append(new(sync_event, (graphs_before, compiles_before, graphs, compiles, now, extra, stepped)))
                if len(pending) >= FLUSH_EVERY:
                    tracker.flush()
                if probe is not None:
                    source._watch_fallbacks(fallbacks)
            except Exception as error:  # noqa: BLE001
                source.step_error(error)
            source.stats.hook_seconds += own + perf_counter() - now
            return result

        return step_marker

    def _compiled(self, compilations: int, since: float) -> None:
        """torch_xla compiled on this thread in a call that began at ``since``: its seconds to the ledger."""
        self.phases().compiled(self.reader.compile_seconds(compilations), since)

    def device_compiling(self) -> tuple[int, float, float, float] | None:
        """While the training thread's step marker or host read compiles: more of its compilations started in the
        call than ended (their ``CompileTime`` samples) since it began. Counted from the first ask that sees it."""
        with self._seen_lock:
            call = self._in_call
            if call is None:
                self._seen_compiling = None
                return None
            now, wall = time.perf_counter(), time.time()
            started = (self.reader.counter_value(UNCACHED_COMPILE) or 0) - call[2]
            if started <= 0 or self.reader.compilations_ended_since(wall - (now - call[1])) >= started:
                self._seen_compiling = None
                return None
            seen = self._seen_compiling
            since = seen[1] if seen is not None and seen[0] is call else now
            self._seen_compiling = (call, now)
            return call[0], call[1], since, now

    def _unusual_sync(
        self, compiles_before: int, compiles: int, unexplained: bool, compiled: tuple[int, int] | None
    ) -> tuple[tuple | None, dict[str, int] | None]:
        """A marker that compiled, or after a cut no host read explains, or with the fallback probe on: (its event's
        ``extra``, the fallback counters if read). ``compiled``: the graphs run and the compilations since the last
        marker or host read, if any compiled."""
        frame = sys._getframe(2)  # the step marker's caller (past this and the wrapper)
        site = (self.sites.site(frame), self.sites.frames(frame)) if compiles != compiles_before else None
        fallbacks = self.reader.fallback_counts() if unexplained else None
        extra = None
        if site is not None or fallbacks is not None or compiled:
            traits = self.reader.graph_traits(*compiled) if compiled else ((), ())
            extra = (site, sum(fallbacks.values()) if fallbacks is not None else None, traits)
        return extra, fallbacks

    def _watch_fallbacks(self, fallbacks: dict[str, int] | None) -> None:
        """After a marker: end the fallback probe's watch of the step that ended, and watch the next one if an
        operator fell back that the probe has not watched."""
        probe = self._probe
        if probe is None:
            return
        if probe.active and probe.disarm():
            self.tracker.on_probe(False)
        if fallbacks and probe.arm(fallbacks):
            self.tracker.on_probe(True)

    def _on_fallback_site(self, op: str, location: str, frames: list[str], backward: bool) -> None:
        self.attribution.fallback_site(op, location, frames, backward)

    def _host_read(self, original, cause: str, tensor, args, kwargs, frame):
        """A host read of an XLA tensor, made from ``frame`` (HostReadHook's ``read``): the compile counters and the
        site before it, the counters after it, one event for the tracker. Written as one function, like the step
        marker's wrapper; its exceptions are the original method's only."""
        perf_counter = time.perf_counter
        start = perf_counter()
        try:
            value = self.reader.counter_value
            compiles_before = value(UNCACHED_COMPILE) or 0
            graphs_before = (value(CACHED_COMPILE) or 0) + compiles_before
            self._in_call = (threading.get_ident(), start, compiles_before)
            # The site is found before the read: the graph the read may run leaves the CPU caches cold, and the less
            # that runs after it, the less the read costs.
            location = self.sites.site(frame)
            frames = None if location in self.attribution.sites else self.sites.frames(frame)
        except Exception as error:  # noqa: BLE001 (never into the training loop)
            self.step_error(error)  # this read is not accounted; one failure is counted
            value = None
        own = perf_counter() - start
        try:
            return original(tensor, *args, **kwargs)
        finally:
            self._in_call = None
            now = perf_counter()
            if value is not None:
                try:
                    compiles = value(UNCACHED_COMPILE) or 0
                    graphs = (value(CACHED_COMPILE) or 0) + compiles - graphs_before
                    compiled = compiles - compiles_before
                    if compiled:
                        self._compiled(compiled, start)
                    self._graphs_seen += graphs
                    self._compiles_seen += compiled
                    traits = self.reader.graph_traits(graphs, compiled) if compiled else ((), ())
                    tracker = self.tracker
                    pending = tracker.pending
                    pending.append(new_event(Read, (cause, location, frames, graphs, compiled, traits)))
                    if len(pending) >= FLUSH_EVERY:
                        tracker.flush()
                except Exception as error:  # noqa: BLE001
                    self.step_error(error)
            self.stats.hook_seconds += own + perf_counter() - now

    def _on_upload(self, frame, shapes: tuple) -> None:
        start = time.perf_counter()
        try:
            location = self.sites.site(frame)
            if location != UNKNOWN:  # a loader's own thread: its batch is recorded where the training thread takes it
                self.tracker.on_upload(location, shapes)
        except Exception as error:  # noqa: BLE001
            self.step_error(error)
        self.stats.hook_seconds += time.perf_counter() - start
