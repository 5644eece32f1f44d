"""The TorchNeuron source where TorchNeuron is not what the exporter knows: a name missing or of another shape is not
read, the rest is, one log line says what, and neuron_exporter_torchneuron_readable shows it. Also its small parts:
failure reasons, counters that never go back, both shapes of the memory statistics, the backend's fallback lines.

The TorchNeuron here is a module made by the test (no device): what is probed is the names, not a device."""

from __future__ import annotations

import logging
import sys
import types

import pytest

from neuron_exporter.config import resolve_options
from neuron_exporter.metric_family import MonotonicTotals
from neuron_exporter.training.neuron import names
from neuron_exporter.training.neuron.compiles import GraphFallbacks, failure_reason
from neuron_exporter.training.neuron.families import ROUNDING
from neuron_exporter.training.self_metrics import SelfStats
from neuron_exporter.training.time_phases import TimePhases

pytestmark = pytest.mark.neuron

STATS = dict.fromkeys((*names.SPLIT_KEYS, *names.COMPILATION_KEYS), 0)


def readable_series(source) -> dict[str, float]:
    return {
        sample.labels["record"]: sample.value
        for family in source.families.collect({})
        if family.name == "neuron_exporter_torchneuron_readable"
        for sample in family.samples
    }


@pytest.fixture
def odd_torchneuron(monkeypatch, tmp_path):
    """A torch_neuronx whose _C has the cache statistics (its metrics off) but no _log_offloaded_op, whose
    get_fallback_ops() returns a number, and no torch.neuron."""
    import torch

    module = types.ModuleType("torch_neuronx")
    module.__file__ = str(tmp_path / "torch_neuronx" / "__init__.py")
    module.__version__ = "2.14.3.0"
    module._C = types.SimpleNamespace(
        _get_compilation_cache_stats=lambda: dict(STATS), _neuron_metrics_enabled=lambda: False
    )
    module.get_fallback_ops = lambda: 3
    monkeypatch.setitem(sys.modules, "torch_neuronx", module)
    monkeypatch.delattr(torch, "neuron", raising=False)
    return module


def test_what_is_missing_is_not_read_and_said_once(odd_torchneuron, caplog):
    from neuron_exporter.training.neuron.source import NeuronSource

    phases = TimePhases(0.0)
    source = NeuronSource(resolve_options(overrides={}), SelfStats(), lambda: phases)
    with caplog.at_level(logging.WARNING, logger="neuron_exporter"):
        assert source.install()
    try:
        assert set(source.problems) == {"offloaded_op", "fallback_ops", "backend_logger", "memory_stats"}
        assert readable_series(source) == {
            "fallback_op_calls": 0,
            "fallback_ops_seen": 0,
            "compile_cache": 1,
            "compiled_graphs": 1,
            "graph_fallbacks": 0,
            "memory": 0,
        }
        lines = [r.getMessage() for r in caplog.records if "TorchNeuron 2.14.3.0" in r.getMessage()]
        assert len(lines) == 1
        assert "_log_offloaded_op is missing" in lines[0] and "returned int, not names" in lines[0]
        assert [r for r in caplog.records if "TORCH_NEURONX_METRICS_ENABLED=1" in r.getMessage()]
        served = {family.name for family in source.families.collect({})}
        assert "torchneuron_compile_cache_hits" in served and "torchneuron_host_reads" in served
        assert not served & {"torchneuron_cpu_fallback_op_calls", "torchneuron_memory_allocated_bytes"}
    finally:
        source.uninstall()


def test_a_failure_reason_is_short_and_bounded():
    assert failure_reason("NRT execution failed: NEFF load error (code 1103) at 0x7f3a\nstack...") == (
        "NRT execution failed: NEFF load error (code N) at N"
    )
    assert failure_reason("") == "unknown"
    assert len(failure_reason("x" * 500)) == 60


def test_counters_read_from_torchneuron_never_go_back_when_it_resets_them():
    totals = MonotonicTotals(ROUNDING)
    assert totals.read(lambda: {"hits": 5}) == {"hits": 5}
    assert totals.read(lambda: {"hits": 2}) == {"hits": 7}  # reset, then 2 more
    assert totals.read(lambda: {"hits": 4}) == {"hits": 9}


def test_a_derived_total_lower_by_a_rounding_error_is_not_a_reset():
    totals = MonotonicTotals(ROUNDING)
    compile_ms, graph_ms = 1733.7 * 3 + 48211.7, 48211.7  # three eager compilations and a graph's, in ms
    before = totals.read(lambda: {"eager_op_seconds": 1733.7 * 3 / 1000})["eager_op_seconds"]
    after = totals.read(lambda: {"eager_op_seconds": (compile_ms - graph_ms) / 1000})["eager_op_seconds"]
    assert (compile_ms - graph_ms) / 1000 < 1733.7 * 3 / 1000  # the difference came out lower, by rounding
    assert after == before  # not doubled


@pytest.mark.parametrize(
    "stats",
    [
        {"allocated_bytes.current": 10, "active_bytes.peak": 30, "num_ooms": 1},  # flattened, as torch.cuda's
        {"allocated_bytes": {"current": 10}, "active_bytes": {"peak": 30}, "num_ooms": 1},  # nested, as _C's
    ],
)
def test_memory_statistics_of_either_shape(stats):
    assert names.memory_value(stats, "allocated_bytes") == 10
    assert names.memory_value(stats, "active_bytes", "peak") == 30
    assert names.memory_value(stats, "num_ooms") == 1
    assert names.memory_value(stats, "num_alloc_retries") is None


def test_a_graph_that_fell_back_is_counted_with_the_reason_logged_before_it():
    counter = GraphFallbacks()
    counter.install()
    logger = logging.getLogger(names.BACKEND_LOGGER)
    try:
        logger.error("Execution failed: NEFF load error 17")
        logger.warning(names.FALLBACK_LINE)
        logger.warning(names.FALLBACK_LINE)  # no failure logged before this one
        logger.info("something else")
    finally:
        counter.uninstall()
    counts, messages = counter.snapshot()
    assert counts == {"NEFF load error N": 1, "unknown": 1}
    assert messages["NEFF load error N"] == "NEFF load error 17"


@pytest.fixture(params=["namespace package", "made in memory"])
def fileless_torchneuron(request, odd_torchneuron, tmp_path):
    """The same torch_neuronx without ``__file__``: a namespace (or zip-imported) package, or a stand-in."""
    import importlib.machinery

    del odd_torchneuron.__file__
    if request.param == "namespace package":
        odd_torchneuron.__path__ = [str(tmp_path / "torch_neuronx")]
        odd_torchneuron.__spec__ = importlib.machinery.ModuleSpec("torch_neuronx", None, is_package=True)
    return odd_torchneuron


def test_a_torchneuron_without_a_file_costs_no_record(fileless_torchneuron):
    from neuron_exporter.training.neuron.source import NeuronSource
    from neuron_exporter.training.sites import SiteFinder

    assert SiteFinder().site(sys._getframe()).startswith("tests/training/test_torchneuron_probes.py:")
    stats = SelfStats()
    source = NeuronSource(resolve_options(overrides={}), stats, lambda: TimePhases(0.0))
    assert source.install()
    try:
        assert readable_series(source)["compile_cache"] == 1
        assert stats.errors["step"] == stats.errors["scrape"] == 0
    finally:
        source.uninstall()


def test_a_build_with_only_the_sums_of_the_cache_tiers_serves_them(odd_torchneuron):
    from neuron_exporter.training.neuron.source import NeuronSource

    aggregate = {"cache_hits": 7, "cache_misses": 2, "total_compilations": 2, "total_compilation_time_ms": 500}
    odd_torchneuron._C._get_compilation_cache_stats = lambda: dict(aggregate)
    stats = SelfStats()
    source = NeuronSource(resolve_options(overrides={}), stats, lambda: TimePhases(0.0))
    assert source.install()
    try:
        assert readable_series(source)["compile_cache"] == 1
        served = {
            (sample.name, sample.labels.get("tier")): sample.value
            for family in source.families.collect({})
            for sample in family.samples
            if family.name.startswith("torchneuron_compile_cache")
        }
        assert served == {
            ("torchneuron_compile_cache_hits_total", "unknown"): 7,
            ("torchneuron_compile_cache_misses_total", None): 2,
        }
        assert stats.errors["scrape"] == 0
    finally:
        source.uninstall()


def test_the_split_by_tier_is_read_where_the_build_has_it():
    split = {"in_memory_hits": 5, "in_memory_misses": 3, "persistent_hits": 1, "cache_hits": 6, "cache_misses": 5}
    assert names.cache_lookups(split) == {"memory": 5, "persistent": 1, "misses": 2}
