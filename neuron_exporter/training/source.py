"""What a source of the training process is, and the handle's list of them.

A *source* reads one library: the training steps of ``torch.optim`` (``steps/``), where the training thread's time
goes (``phases/``: input pipelines, checkpoints, dynamo's compilations; the other sources feed its ledger too), the
samples and tokens of its batches (``throughput/``), dynamo's records (``torch_compile/``), torch_xla's step
markers, host reads and fallbacks (``xla/``), TorchNeuron's fallbacks, compile cache, host reads and memory
(``neuron/``). Each room declares itself with a ``SourceKind`` in
its ``__init__`` (which imports nothing of the library): its name (the ``source`` label), the module whose import
starts it, and ``start(sources)``, which builds it then and only then, so a process without torch_xla never loads the
XLA source. ``Sources`` runs them all the same way:

- started right after the library's import has ended (``import_watch``), on the importing thread;
- a source that cannot start (its constructor or ``install()`` fails) is shown by
  ``neuron_exporter_source_started{source} 0``, its failure counted and logged once (``SelfStats``), and tried again
  at the training thread's next chances, an optimizer created or stepped (``retry``), up to ``START_TRIES`` times;
- its collector parts join the rank's collector once it has started;
- optimizer events, the fork of the process, the diagnosis document and ``detach()`` go to every started source.

Sibling sources never import each other (``tests/test_layout.py``) nor ask for each other by name; what two of them
share lives at ``training/``. What only some sources do is a capability (``SeesOptimizerSteps``, ``SeesStepsEnd``,
``CountsDeviceSteps``, ...), checked once when a source starts. The couplings between sources are two: the device
sources feed the time ledger (``Sources.phases``) with host reads and compilations, and a source whose device runs an
optimizer's work later (torch_xla's) counts the steps that end there (``CountsDeviceSteps``), which the training
steps ask ``Sources`` for, by device, not by source.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from prometheus_client.core import Metric

from .. import fork_safe
from ..config import Options
from .histogram import Histogram
from .import_watch import after_import, forget, poll
from .rank_collector import RankCollector
from .rank_run import RankRun
from .self_metrics import START_TRIES, SelfStats
from .time_phases import TimePhases

log = logging.getLogger("neuron_exporter")

Collect = Callable[[dict[str, str]], Iterator[Metric]]


class StepCounts(Protocol):
    """Training steps a source counts itself, where they end at a device's step and not at the optimizer step."""

    steps: int
    step_duration: Histogram
    optimizer_steps: bool  # whether the steps are training steps (an optimizer stepped), not only device steps


class Source(ABC):
    """What every source is: hooks that go in and come out, failures counted, a forked child's own counts, its parts
    of the rank's collector and of the diagnosis. What only some sources have is a capability (below), a member they
    have or have not, which ``Sources`` checks once, when a source starts."""

    stats: SelfStats | None = None  # where its failures are counted; replaced in a forked child

    @abstractmethod
    def install(self) -> bool:
        """Put the hooks in. False if they could not go in, having counted why (``step_error``) and left nothing
        installed; it may be called again on a new instance."""

    @abstractmethod
    def uninstall(self) -> None:
        """Take the hooks out (``detach()``); what was counted is still served."""

    def step_error(self, error: BaseException) -> None:
        """Every source's one path for a failure of its own on the training thread or in a hook: counted in
        ``neuron_exporter_collection_errors_total{stage="step"}`` and logged once (``SelfStats``); the training goes
        on. A failure while a scrape reads it is the rank collector's (``stage="scrape"``)."""
        if self.stats is not None:
            self.stats.record_error("step", error)
        else:
            log.debug("neuron-exporter: %s failed: %s", type(self).__name__, error)

    def after_fork(self, stats: SelfStats) -> None:
        """In a forked child: count from zero, as the child's own, into ``stats``; the hooks stay (its locks are
        renewed by ``fork_safe``)."""
        self.stats = stats

    def parts(self) -> dict[str, Collect]:
        """Its parts of the rank's collector, by name (``neuron_exporter_collector_success{collector}``)."""
        return {}

    def diagnosis(self, rank: dict) -> None:  # noqa: B027 (a source may add nothing)
        """Add its part to this rank's diagnosis document (``neuron_exporter.diagnosis``)."""


# -- capabilities: what a source has or has not ---------------------------------------------------------------------
class SeesOptimizersMade(Protocol):
    def on_optimizer_created(self) -> None:
        """A ``torch.optim`` optimizer was made (training thread; never raises)."""


class SeesOptimizerSteps(Protocol):
    def on_optimizer_step(self, optimizer) -> None:
        """After an optimizer's ``step()``, on the thread that stepped it: the cheapest thing possible."""


class SeesStepsEnd(Protocol):
    """It sees training steps end: the rank's liveness, and its claim to the rank."""

    @property
    def last_active(self) -> float | None:
        """time.perf_counter() at the end of its last step, None if it saw none."""


class SeesCompilations(Protocol):
    @property
    def has_compiled(self) -> bool:
        """Whether it saw a compilation (which claims the rank, like a step)."""


class CountsDeviceSteps(Protocol):
    """A lazy device's source, which ends the training steps of optimizers on its ``device`` (a device type) at the
    device's own step and counts them: the training steps ask ``Sources`` for them (the one coupling between
    sources, besides the ledger that the device sources feed)."""

    device: str

    def step_counts(self) -> StepCounts: ...


MEMBERS: dict[type, tuple[str, ...]] = {
    SeesOptimizersMade: ("on_optimizer_created",),
    SeesOptimizerSteps: ("on_optimizer_step",),
    SeesStepsEnd: ("last_active",),
    SeesCompilations: ("has_compiled",),
    CountsDeviceSteps: ("device", "step_counts"),
}


def has(source: Source, capability: type) -> bool:
    """Whether ``source`` has ``capability``: its class has every member (a property is not evaluated)."""
    return all(hasattr(type(source), member) for member in MEMBERS[capability])


@dataclass(frozen=True)
class SourceKind:
    name: str  # the value of the ``source`` label
    library: str  # the module whose import starts it
    start: Callable[[Sources], Source]  # builds it (the room's modules may import the library)


class Sources:
    def __init__(
        self,
        kinds: tuple[SourceKind, ...],
        options: Options,
        stats: SelfStats,
        collector: RankCollector,
        run: RankRun,
    ):
        self.kinds = kinds
        self.run = run  # the rank's run across its processes (replaced in a forked child)
        self.phases: TimePhases = run.ledger  # the training thread's time, which every source may feed
        self.options = options
        self.stats = stats  # replaced in a forked child
        self.collector = collector
        self.started: tuple[Source, ...] = ()  # a new tuple at each start: the training thread loops over it
        # Those of the started with each capability, likewise.
        self.made: tuple[Any, ...] = ()  # SeesOptimizersMade
        self.stepped: tuple[Any, ...] = ()  # SeesOptimizerSteps
        self.steps_end: tuple[Any, ...] = ()  # SeesStepsEnd
        self.compilations: tuple[Any, ...] = ()  # SeesCompilations
        self.device_steps: tuple[Any, ...] = ()  # CountsDeviceSteps
        self.by_name: dict[str, Source] = {}
        self.tries: dict[str, int] = {}
        self.retrying = False  # a source failed to start and has tries left
        self.active = False
        self._starters = {kind.name: _starter(self, kind) for kind in kinds}
        self._lock = fork_safe.RLock()  # the importing thread and the training thread may both try to start one

    def watch(self) -> None:
        """Start each source once its library is imported (at once if it is)."""
        self.active = True
        for kind in self.kinds:
            after_import(kind.library, self._starters[kind.name])

    def start(self, kind: SourceKind) -> None:
        with self._lock:
            self._start(kind)

    def _start(self, kind: SourceKind) -> None:
        if not self.active or kind.name in self.by_name or self.tries.get(kind.name, 0) >= START_TRIES:
            return
        self.tries[kind.name] = self.tries.get(kind.name, 0) + 1
        self.stats.sources[kind.name] = False
        built: Source | None = None
        try:
            source = built = kind.start(self)
            installed = source.install()
        except Exception as error:  # noqa: BLE001 (never into the user's import or training loop)
            self.stats.record_error("step", error)
            installed = False
            if built is not None:
                self._take_out(built)  # what went in before it failed: the next try must not hook twice
        if not installed:
            self.retrying = True
            return
        self.by_name[kind.name] = source
        self.started = (*self.started, source)
        self.made += (source,) if has(source, SeesOptimizersMade) else ()
        self.stepped += (source,) if has(source, SeesOptimizerSteps) else ()
        self.steps_end += (source,) if has(source, SeesStepsEnd) else ()
        self.compilations += (source,) if has(source, SeesCompilations) else ()
        self.device_steps += (source,) if has(source, CountsDeviceSteps) else ()
        self.stats.sources[kind.name] = True
        for name, collect_part in source.parts().items():
            self.collector.add_part(name, collect_part)

    def retry(self) -> None:
        """The training thread's chance for a source that has not started: a library whose import ended unnoticed
        (``import_watch.poll``), or a source whose hooks could not go in."""
        poll()
        if not self.retrying:
            return
        self.retrying = False
        for kind in self.kinds:
            if self.stats.sources.get(kind.name) is False:
                self.start(kind)
        self.retrying = any(
            self.stats.sources.get(kind.name) is False and self.tries.get(kind.name, 0) < START_TRIES
            for kind in self.kinds
        )

    def get(self, name: str) -> Source | None:
        return self.by_name.get(name)

    def step_counts(self, device: str) -> StepCounts | None:
        """The training steps of optimizers on the lazy ``device`` (a device type), from the source that counts them;
        None if no source started counts them."""
        for source in self.device_steps:
            if source.device == device:
                return source.step_counts()
        return None

    # -- what the handle asks of all -----------------------------------------------------------------------
    def on_optimizer_created(self) -> None:
        self.retry()
        for source in self.made:
            source.on_optimizer_created()
        self.phases.optimizer_created()  # after the sources, which may have told it of compilations till now

    def on_optimizer_step(self, optimizer) -> None:
        if self.retrying:
            self.retry()
        else:
            poll()
        for source in self.stepped:
            source.on_optimizer_step(optimizer)
        self.phases.optimizer_stepped()

    @property
    def last_active(self) -> float | None:
        ends = [end for end in (source.last_active for source in self.steps_end) if end is not None]
        return max(ends) if ends else None

    @property
    def has_compiled(self) -> bool:
        return any(source.has_compiled for source in self.compilations)

    def diagnosis(self, rank: dict) -> None:
        for source in self.started:
            source.diagnosis(rank)

    def after_fork(self, stats: SelfStats, run: RankRun) -> None:
        self.stats = stats
        self.run = run
        self.phases = run.ledger
        for source in self.started:
            source.after_fork(stats)

    def stop(self) -> None:
        with self._lock:  # no source starts half-way through: it would stay hooked after detach()
            self.active = False
            for starter in self._starters.values():
                forget(starter)
            for source in self.started:
                source.uninstall()
            self.phases.finish()

    def _take_out(self, source: Source) -> None:
        try:
            source.uninstall()
        except Exception as error:  # noqa: BLE001
            self.stats.record_error("step", error)


def _starter(sources: Sources, kind: SourceKind) -> Callable[[], None]:
    def start() -> None:
        sources.start(kind)

    return start
