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
from ..time_phases import DeviceCall, TimePhases
from .dynamo_bridge import BridgeCompilations
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
        self._probe_call = self._compiling  # one bound method for every call's probe
        self._bridge = BridgeCompilations(phases, self.step_error)
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
        self._bridge.install()
        return True

    def uninstall(self) -> None:
        self._hook.uninstall()
        self._bridge.uninstall()
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

        def step_marker(*args, **kwargs):
            if not hook.active:
                return original(*args, **kwargs)
            start = perf_counter()
            try:
                value = source.reader.counter_value
                compiles_before = value(UNCACHED_COMPILE) or 0
                graphs_before = (value(CACHED_COMPILE) or 0) + compiles_before
                ledger = source.phases()
                call = ledger.device_call(source._probe_call, compiles_before)
            except Exception as error:  # noqa: BLE001 (never into the training loop)
                source.step_error(error)  # this marker is not accounted; one failure is counted
                value = None
            own = perf_counter() - start
            try:
                result = original(*args, **kwargs)  # its exceptions reach the caller unchanged
            finally:
                now = perf_counter()
                if value is not None:
                    try:
                        compiles = source._call_ended(ledger, call, compiles_before)
                    except Exception as error:  # noqa: BLE001
                        source.step_error(error)
                        value = None
            if value is None:
                return result
            try:
                graphs = (value(CACHED_COMPILE) or 0) + compiles
                # Graphs run since the last marker that no host read ran: a CPU fallback may have cut them.
                graphs_seen, compiles_seen = source._graphs_seen, source._compiles_seen
                unexplained = graphs_before != graphs_seen
                compiled = compiles != compiles_seen  # at the marker or at a cut no host read explains
                source._graphs_seen, source._compiles_seen = graphs, compiles
                probe = source._probe
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

    def _call_ended(self, ledger: TimePhases, call: DeviceCall, compiles_before: int) -> int:
        """A step marker or host read ended, whatever became of it: the seconds torch_xla compiled in it (none,
        mostly) to the ledger; the compilations so far (``UncachedCompile``)."""
        compiles = self.reader.counter_value(UNCACHED_COMPILE) or 0
        try:
            seconds = self.reader.compile_seconds(compiles - compiles_before) if compiles != compiles_before else 0.0
        except Exception as error:  # noqa: BLE001 (never into the training loop; the call must still end)
            self.step_error(error)
            seconds = 0.0
        ledger.device_call_ended(call, seconds)
        return compiles

    def _compiling(self, call: DeviceCall) -> bool:
        """Asked by reads of the ledger, from any thread, while a step marker or host read runs: whether it compiles
        now, i.e. more of its compilations started than ended (their ``CompileTime`` samples) since it began."""
        try:
            now, wall = time.perf_counter(), time.time()
            started = (self.reader.counter_value(UNCACHED_COMPILE) or 0) - call.token  # type: ignore[operator]
            return started > 0 and self.reader.compilations_ended_since(wall - (now - call.start)) < started
        except Exception as error:  # noqa: BLE001 (the totals are served without it)
            self.stats.record_error("scrape", error)
            return False

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
            ledger = self.phases()
            call = ledger.device_call(self._probe_call, compiles_before)
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
            now = perf_counter()
            if value is not None:
                try:
                    compiles = self._call_ended(ledger, call, compiles_before)
                    graphs = (value(CACHED_COMPILE) or 0) + compiles - graphs_before
                    compiled = compiles - compiles_before
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
