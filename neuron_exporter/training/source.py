"""What a source of the training process is, and the handle's list of them.

A *source* reads one library: the training steps of ``torch.optim`` (``steps/``), where the training thread's time
goes (``phases/``: input pipelines, checkpoints, dynamo's compilations; the other sources feed its ledger too),
dynamo's records (``torch_compile/``), torch_xla's step markers, host reads and fallbacks (``xla/``), TorchNeuron's
fallbacks, compile cache, host reads and memory (``neuron/``). Each room declares itself with a ``SourceKind`` in
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
share lives at ``training/``. A source whose device runs an optimizer's work later (torch_xla's) declares that device
(``Source.device``) and counts the steps that end there (``step_counts``); the training steps ask ``Sources`` for the
steps of a device, not of a source.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

from prometheus_client.core import Metric

from .. import fork_safe
from ..config import Options
from .histogram import Histogram
from .import_watch import after_import, forget, poll
from .rank_collector import RankCollector
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
    """The contract of a source, with what a source that has nothing of a kind does. ``install`` and ``uninstall``
    are each source's own; the rest is optional."""

    stats: SelfStats | None = None  # where its failures are counted; replaced in a forked child
    device: str | None = None  # the lazy device whose training steps it ends and counts itself (``step_counts``)

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

    def after_fork(self, stats: SelfStats) -> None:  # noqa: B027 (optional: nothing to do)
        """In a forked child: count from zero, as the child's own, into ``stats``; the hooks stay."""

    def parts(self) -> dict[str, Collect]:
        """Its parts of the rank's collector, by name (``neuron_exporter_collector_success{collector}``)."""
        return {}

    def diagnosis(self, rank: dict) -> None:  # noqa: B027 (optional: nothing to do)
        """Add its part to this rank's diagnosis document (``neuron_exporter.diagnosis``)."""

    def on_optimizer_created(self) -> None:  # noqa: B027 (optional: nothing to do)
        """A ``torch.optim`` optimizer was made (training thread; never raises)."""

    def on_optimizer_step(self, optimizer) -> None:  # noqa: B027 (optional: nothing to do)
        """After an optimizer's ``step()``, on the thread that stepped it: the cheapest thing possible."""

    @property
    def last_active(self) -> float | None:
        """time.perf_counter() at the end of its last step, None if it saw none."""
        return None

    @property
    def compiled(self) -> bool:
        """Whether it saw a compilation (which claims the rank, like a step)."""
        return False

    def step_counts(self) -> StepCounts | None:
        """The training steps of optimizers on its ``device``, which it counts itself; None without a device."""
        return None


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
        phases: TimePhases,
    ):
        self.kinds = kinds
        self.phases = phases  # the training thread's time, which every source may feed (replaced in a forked child)
        self.options = options
        self.stats = stats  # replaced in a forked child
        self.collector = collector
        self.started: tuple[Source, ...] = ()  # a new tuple at each start: the training thread loops over it
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
        for source in self.started:
            if source.device == device:
                return source.step_counts()
        return None

    # -- what the handle asks of all -----------------------------------------------------------------------
    def on_optimizer_created(self) -> None:
        self.retry()
        for source in self.started:
            source.on_optimizer_created()
        self.phases.optimizer_created()  # after the sources, which may have told it of compilations till now

    def on_optimizer_step(self, optimizer) -> None:
        if self.retrying:
            self.retry()
        else:
            poll()
        for source in self.started:
            source.on_optimizer_step(optimizer)
        self.phases.optimizer_stepped()

    @property
    def last_active(self) -> float | None:
        ends = [end for end in (source.last_active for source in self.started) if end is not None]
        return max(ends) if ends else None

    @property
    def compiled(self) -> bool:
        return any(source.compiled for source in self.started)

    def diagnosis(self, rank: dict) -> None:
        for source in self.started:
            source.diagnosis(rank)

    def after_fork(self, stats: SelfStats, phases: TimePhases) -> None:
        self.stats = stats
        self.phases = phases
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
