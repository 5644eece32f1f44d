"""The time-phases source: wraps the entry points (``entry_points``) as their modules are imported, brackets
dynamo's compilations, and serves the ledger's totals."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator

from prometheus_client.core import Metric

from ...catalogue import TRAINING_TIME
from ...metric_family import labelled_family
from ..dynamo_callbacks import CompileCallbacks
from ..dynamo_skip import never_compiled
from ..import_watch import after_import, forget
from ..patching import Patch
from ..self_metrics import SelfStats
from ..source import Source, Sources
from ..time_phases import PHASES
from .entry_points import ENTRY_POINTS


class TimePhasesSource(Source):
    def __init__(self, sources: Sources):
        self._sources = sources
        self.stats = sources.stats
        self._patches: list[Patch] = []
        self._watching: dict[str, Callable[[], None]] = {}
        self._callbacks = CompileCallbacks(self._compile_started, self._compile_ended, self.step_error)
        self._installed = False

    def install(self) -> bool:
        self._installed = True
        for module in ENTRY_POINTS:
            self._watching[module] = watch = _after(self._wrap_module, module)
            after_import(module, watch)
        after_import("torch._dynamo", self._register_callbacks)
        return True

    def uninstall(self) -> None:
        self._installed = False
        for watch in self._watching.values():
            forget(watch)
        forget(self._register_callbacks)
        self._callbacks.remove()
        for patch in self._patches:
            patch.undo()

    def after_fork(self, stats: SelfStats) -> None:
        self.stats = stats  # the ledger is the handle's: a forked child's comes with its Sources

    def on_optimizer_created(self) -> None:
        self._register_callbacks()  # again, if torch._dynamo.reset() dropped them

    def parts(self) -> dict:
        return {"time_phases": self.families}

    def diagnosis(self, rank: dict) -> None:
        rank["time_phases"] = self._read()

    def families(self, labels: dict[str, str]) -> Iterator[Metric]:
        totals = self._read()
        yield labelled_family(TRAINING_TIME, labels, (((phase,), totals[phase]) for phase in PHASES))

    def _read(self) -> dict[str, float]:
        """The ledger's totals, with a device's compilation that runs now counted up to now."""
        phases = self._sources.phases
        for source in self._sources.started:
            try:
                compiling = source.device_compiling()
            except Exception as error:  # noqa: BLE001 (the totals are served without it)
                self._sources.stats.record_error("scrape", error)
                continue
            if compiling is not None:
                phases.device_compiling(*compiling)
        return phases.read()

    # -- hooks ------------------------------------------------------------------------------------------------
    def _register_callbacks(self) -> None:
        if self._installed:
            self._callbacks.register()

    def _compile_started(self, *args) -> None:
        self._sources.phases.compile_started()

    def _compile_ended(self, *args) -> None:
        self._sources.phases.compile_ended()

    def _wrap_module(self, name: str) -> None:
        if not self._installed:
            return
        module = sys.modules.get(name)
        for owner_name, attribute, phase in ENTRY_POINTS[name]:
            owner = getattr(module, owner_name, None) if owner_name else module
            if owner is None or not callable(getattr(owner, attribute, None)):
                continue
            patch = Patch(owner, attribute, _timed(self._sources, phase), self.step_error)
            if patch.install():
                self._patches.append(patch)


def _after(wrap_module: Callable[[str], None], name: str) -> Callable[[], None]:
    def imported() -> None:
        wrap_module(name)

    return imported


def _timed(sources: Sources, phase: str) -> Callable[[Callable], Callable]:
    def wrap(original: Callable) -> Callable:
        def timed(*args, **kwargs):
            phases = sources.phases
            if not phases.enter(phase):
                return original(*args, **kwargs)
            try:
                return original(*args, **kwargs)
            finally:
                phases.leave()

        timed.__name__ = getattr(original, "__name__", "timed")
        timed.__qualname__ = getattr(original, "__qualname__", timed.__name__)
        timed.__doc__ = getattr(original, "__doc__", None)
        timed.__wrapped__ = original  # type: ignore[attr-defined]
        never_compiled(timed)
        return timed

    return wrap
