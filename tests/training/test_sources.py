"""The contract ``Sources`` keeps with every source, on a source of its own: whatever fails half-way through a start
is taken out before the next try, and ``detach()`` leaves nothing hooked."""

from __future__ import annotations

import types

import pytest

from neuron_exporter.config import resolve_options
from neuron_exporter.training.patching import Patch
from neuron_exporter.training.rank_collector import RankCollector
from neuron_exporter.training.rank_run import RankRun
from neuron_exporter.training.self_metrics import SelfStats
from neuron_exporter.training.source import Source, SourceKind, Sources
from neuron_exporter.training.time_phases import TimePhases


def original() -> str:
    return "original"


class HookingSource(Source):
    """Wraps ``library.call``, then (at its first start) fails before it is done."""

    def __init__(self, library, stats: SelfStats, fail: bool):
        on_error = lambda error: stats.record_error("step", error)  # noqa: E731
        self.patch = Patch(library, "call", lambda inner: lambda: "hooked " + inner(), on_error)
        self.fail = fail

    def install(self) -> bool:
        self.patch.install()
        if self.fail:
            raise RuntimeError("injected failure after the hook went in")
        return True

    def uninstall(self) -> None:
        self.patch.undo()


def sources_of(library) -> tuple[Sources, list[HookingSource]]:
    stats = SelfStats()
    built: list[HookingSource] = []

    def start(sources: Sources) -> Source:
        built.append(HookingSource(library, stats, fail=not built))
        return built[-1]

    kind = SourceKind("hooking", "json", start)  # json is imported: it starts at once
    return Sources((kind,), resolve_options(env={}), stats, RankCollector(stats), RankRun(TimePhases(0.0), 0.0)), built


def test_a_source_that_fails_half_way_is_taken_out_and_its_next_try_hooks_once():
    library = types.SimpleNamespace(call=original)
    sources, built = sources_of(library)
    sources.watch()
    assert len(built) == 1 and library.call is original  # its hook did not stay
    assert sources.stats.sources == {"hooking": False} and sources.stats.errors["step"] == 1
    sources.retry()
    assert len(built) == 2 and sources.stats.sources == {"hooking": True}
    assert library.call() == "hooked original"  # once, not twice
    sources.stop()
    assert library.call is original


def test_a_source_must_say_how_its_hooks_go_in_and_come_out():
    class Incomplete(Source):
        def install(self) -> bool:
            return True

    with pytest.raises(TypeError, match="uninstall"):
        Incomplete()  # type: ignore[abstract]


def test_the_texts_that_list_the_sources_name_every_one():
    import neuron_exporter.training as training
    from neuron_exporter.training import attach, source

    rooms = {f"``{kind.start.__module__.rpartition('.')[2]}/``" for kind in attach.SOURCES}
    assert len(rooms) == 6
    for module in (training, source, attach):
        assert {room for room in rooms if room not in (module.__doc__ or "")} == set(), module.__name__


def test_the_help_of_source_started_says_how_often_a_source_is_tried():
    from neuron_exporter.catalogue import SOURCE_STARTED
    from neuron_exporter.training.self_metrics import START_TRIES

    assert f"up to {START_TRIES} times" in SOURCE_STARTED.help


def test_what_only_some_sources_do_is_a_capability_checked_once_when_they_start():
    class Stepping(HookingSource):
        steps_seen = 0

        def on_optimizer_step(self, optimizer) -> None:
            self.steps_seen += 1

        @property
        def has_compiled(self) -> bool:
            raise AssertionError("a capability is found without reading it")

    stats = SelfStats()
    library = types.SimpleNamespace(call=original)
    built: list[Stepping] = []
    kind = SourceKind("stepping", "json", lambda sources: built.append(Stepping(library, stats, False)) or built[-1])
    sources = Sources((kind,), resolve_options(env={}), stats, RankCollector(stats), RankRun(TimePhases(0.0), 0.0))
    sources.watch()
    assert sources.stepped == tuple(built) and sources.compilations == tuple(built)
    assert sources.made == sources.steps_end == sources.device_steps == ()
    sources.on_optimizer_created()  # none sees optimizers made: nothing is asked of it
    sources.on_optimizer_step(object())
    assert built[0].steps_seen == 1
    sources.stop()
