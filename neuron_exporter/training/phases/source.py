"""The time-phases source: wraps the entry points (``entry_points``) as their modules are imported, listens to the
input pipelines' (``input_pipelines``: the data phase), tells the ledger of dynamo's compilations, and serves the
ledger's totals."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from concurrent.futures import Future

from prometheus_client.core import Metric

from ...catalogue import TRAINING_LOST, TRAINING_RESTARTS, TRAINING_TIME
from ...metric_family import labelled_family, single_series
from .. import dynamo_callbacks
from ..dynamo_skip import standing_in
from ..import_watch import after_import, forget
from ..input_pipelines import BATCH, PIPELINES, START
from ..patching import Patch
from ..source import Source, Sources
from ..time_phases import DATA, PHASES, Lane, TimePhases
from .entry_points import ENTRY_POINTS
from .resume_points import RESUME_POINTS, restored_step

FUTURE_FIELDS = ("staging_completion", "upload_completion")  # torch.distributed.checkpoint's AsyncSaveResponse


class TimePhasesSource(Source):
    def __init__(self, sources: Sources):
        self._sources = sources
        self.stats = sources.stats
        self._patches: list[Patch] = []
        self._watching: dict[str, Callable[[], None]] = {}
        self._listener: dynamo_callbacks.Listener | None = None
        self._data = DataPhase(sources)
        self._installed = False

    def install(self) -> bool:
        self._installed = True
        PIPELINES.add(self._data, (BATCH, START), self.step_error)
        for module in ENTRY_POINTS:
            self._watching[module] = watch = _after(self._wrap_module, module)
            after_import(module, watch)
        for module in RESUME_POINTS:
            self._watching[module + ":resume"] = watch = _after(self._wrap_resume_point, module)
            after_import(module, watch)
        after_import("torch._dynamo", self._listen)
        return True

    def uninstall(self) -> None:
        self._installed = False
        PIPELINES.remove(self._data)
        for watch in self._watching.values():
            forget(watch)
        forget(self._listen)
        dynamo_callbacks.forget(self._listener)
        self._listener = None
        for patch in self._patches:
            patch.undo()

    def parts(self) -> dict:
        return {"time_phases": self.families}

    def diagnosis(self, rank: dict) -> None:
        run = self._sources.run
        rank["time_phases"] = run.totals(self._sources.phases.read())
        rank["restarts"], rank["lost_seconds"] = run.restarts, run.lost_seconds

    def families(self, labels: dict[str, str]) -> Iterator[Metric]:
        run = self._sources.run
        if run.taken_for is None:
            return  # until the spool thread has looked for the rank's earlier process: its counts come first
        totals = run.totals(self._sources.phases.read())
        yield labelled_family(TRAINING_TIME, labels, (((phase,), totals[phase]) for phase in PHASES))
        yield single_series(TRAINING_RESTARTS, labels, run.restarts)
        yield single_series(TRAINING_LOST, labels, run.lost_seconds)

    # -- hooks ------------------------------------------------------------------------------------------------
    def _listen(self) -> None:
        if self._installed and self._listener is None:
            self._listener = dynamo_callbacks.listen(self._compile_started, self._compile_ended, self.step_error)

    def _compile_started(self, compilation: dynamo_callbacks.Compilation) -> None:
        self._sources.phases.compile_started()

    def _compile_ended(self, compilation: dynamo_callbacks.Compilation) -> None:
        self._sources.phases.compile_ended()

    def _wrap_module(self, name: str) -> None:
        if not self._installed:
            return
        module = sys.modules.get(name)
        for owner_name, attribute, phase, *future in ENTRY_POINTS[name]:
            owner = getattr(module, owner_name, None) if owner_name else module
            if owner is None or not callable(getattr(owner, attribute, None)):
                continue
            timed = _timed(self._sources, phase, bool(future), save="save" in attribute)
            patch = Patch(owner, attribute, timed, self.step_error)
            if patch.install():
                self._patches.append(patch)

    def _wrap_resume_point(self, name: str) -> None:
        owner_name, attribute, kind = RESUME_POINTS[name]
        owner = getattr(sys.modules.get(name), owner_name, None)
        if not self._installed or owner is None or not callable(getattr(owner, attribute, None)):
            return
        patch = Patch(owner, attribute, _restoring(self._sources, kind, self.step_error), self.step_error)
        if patch.install():
            self._patches.append(patch)


class DataPhase:
    """The input pipelines' entry points, timed as the ``data`` phase on the ledger of the moment (a forked child's is
    another)."""

    def __init__(self, sources: Sources):
        self._sources = sources

    def entered(self) -> tuple[TimePhases, Lane] | None:
        phases = self._sources.phases
        lane = phases.open(DATA)
        return None if lane is None else (phases, lane)

    def left(self, opened: tuple[TimePhases, Lane] | None, batch: object) -> None:
        if opened is not None:
            opened[0].close(opened[1])


def _time_waits(result, sources: Sources, phase: str) -> None:
    """Waiting on the futures ``result`` is or holds (``async_save``'s, or its response's staging and upload) is
    ``phase``: each one's ``result()`` is wrapped on that object alone."""
    futures = [result] if isinstance(result, Future) else [getattr(result, name, None) for name in FUTURE_FIELDS]
    for future in futures:
        if isinstance(future, Future):
            future.result = _waited(future.result, sources, phase)  # type: ignore[method-assign]


def _waited(result: Callable, sources: Sources, phase: str) -> Callable:
    """``result`` (a future's), timed as ``phase``: made per future, so not marked for dynamo (a registration per
    future, until dynamo is imported, would pile up)."""

    def timed_result(*args, **kwargs):
        phases = sources.phases
        lane = phases.open(phase)
        try:
            return result(*args, **kwargs)
        finally:
            if lane is not None:
                phases.close(lane)

    return timed_result


def _after(wrap_module: Callable[[str], None], name: str) -> Callable[[], None]:
    def imported() -> None:
        wrap_module(name)

    return imported


def _restoring(
    sources: Sources, kind: str, on_error: Callable[[BaseException], None]
) -> Callable[[Callable], Callable]:
    """``load_state_dict`` of an optimizer or scheduler (``kind``), telling the run the step its state had made."""

    def wrap(original: Callable) -> Callable:
        def load_state_dict(self, state_dict, *args, **kwargs):
            result = original(self, state_dict, *args, **kwargs)
            try:
                step = restored_step(kind, state_dict)
                if step is not None:
                    sources.run.restored(kind, step)
            except Exception as error:  # noqa: BLE001 (never into the user's loading)
                on_error(error)
            return result

        return standing_in(load_state_dict, original)

    return wrap


def _timed(
    sources: Sources, phase: str, returns_futures: bool = False, save: bool = False
) -> Callable[[Callable], Callable]:
    def wrap(original: Callable) -> Callable:
        def timed(*args, **kwargs):
            phases = sources.phases
            if save:
                try:
                    sources.run.saving()
                except Exception as error:  # noqa: BLE001
                    sources.stats.record_error("step", error)
            lane = phases.open(phase)
            if lane is None:
                return original(*args, **kwargs)
            try:
                result = original(*args, **kwargs)
            finally:
                phases.close(lane)
            if returns_futures:
                _time_waits(result, sources, phase)
            return result

        return standing_in(timed, original)

    return wrap
