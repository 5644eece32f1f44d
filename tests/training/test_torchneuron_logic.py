"""The TorchNeuron families' and hooks' own logic, with small stand-ins for what TorchNeuron and a scrape read: the
split of compilations between graphs and eager operators, overlapping scrapes, the graph-fallback count on the
backend's logger, dynamo's callbacks after ``torch._dynamo.reset()``, a forked child's fresh totals."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from neuron_exporter.training.attribution import Attribution
from neuron_exporter.training.neuron.compiles import CacheWindow, GraphFallbacks
from neuron_exporter.training.neuron.families import NeuronFamilies
from neuron_exporter.training.neuron.names import BACKEND_LOGGER


def _families(readable: tuple[str, ...], **source) -> NeuronFamilies:
    return NeuronFamilies(SimpleNamespace(readable=readable, attribution=Attribution(), **source), 100, 100)


def _scrape(families: NeuronFamilies) -> dict[tuple, float]:
    return {
        (sample.name, *sorted(sample.labels.values())): sample.value
        for family in families.collect({})
        for sample in family.samples
    }


def _cache(stats: dict) -> tuple[NeuronFamilies, CacheWindow]:
    def read() -> dict:
        return dict(stats)

    window = CacheWindow(read, lambda error: None)
    return _families(("compile_cache",), window=window, cache_stats=read), window


def test_a_scrape_during_a_compile_window_moves_no_compilation_back_to_eager():
    stats = {"total_compilations": 10, "total_compilation_time_ms": 10_000}
    families, window = _cache(stats)
    scrapes = [_scrape(families)]
    window._start()
    stats.update(total_compilations=12, total_compilation_time_ms=12_000)  # the graph's two NEFFs, mid-window
    scrapes.append(_scrape(families))
    window._end()
    scrapes.append(_scrape(families))
    for kind, expected in (("eager_op", [10, 10, 10]), ("graph", [0, 2, 2])):
        assert [scrape[("torchneuron_compilations_total", kind)] for scrape in scrapes] == expected
        assert [scrape[("torchneuron_compile_seconds_total", kind)] for scrape in scrapes] == expected


def test_overlapping_scrapes_never_apply_a_stale_read_as_a_reset():
    """A scrape that read 1000 hits, applied after one that read 1005: the counter must not jump to 2005."""
    reads: list[int] = []
    newer = threading.Thread(target=lambda: results.append(_scrape(families)))
    results: list[dict] = []

    def read() -> dict:
        reads.append(1)
        if len(reads) == 1:  # the first scrape's read is slow: the second one reads and applies meanwhile
            newer.start()
            newer.join(timeout=1)
            return {"in_memory_hits": 1000}
        return {"in_memory_hits": 1005}

    window = CacheWindow(read, lambda error: None)
    families = _families(("compile_cache",), window=window, cache_stats=read)
    results.append(_scrape(families))
    newer.join(timeout=5)
    results.append(_scrape(families))
    hits = [scrape[("torchneuron_compile_cache_hits_total", "memory")] for scrape in results]
    assert max(hits) == 1005 and hits[-1] == 1005, hits


def test_a_forked_child_starts_from_fresh_totals():
    stats = {"num_ooms": 5}
    families = _families(("memory",), memory_stats=lambda: dict(stats))
    assert _scrape(families)[("torchneuron_memory_ooms_total",)] == 5
    families.clear()  # NeuronSource.after_fork
    stats["num_ooms"] = 2  # the child's own count
    assert _scrape(families)[("torchneuron_memory_ooms_total",)] == 2


@pytest.mark.parametrize(
    "broken",
    [
        {"memory_stats": RuntimeError("device lost")},  # raises
        {"cache_stats": None},  # another shape than at the start-up probe
        {"cache_stats": {"in_memory_hits": "many"}},
    ],
    ids=["memory raises", "cache none", "cache string"],
)
def test_a_record_that_fails_at_a_scrape_is_shown_unreadable_and_the_others_are_served(broken):
    def reader(value):
        def read():
            if isinstance(value, Exception):
                raise value
            return value

        return read

    source = {"memory_stats": reader({"allocated_bytes": 10}), "cache_stats": reader({"in_memory_hits": 3})}
    source.update({name: reader(value) for name, value in broken.items()})
    errors: list[str] = []
    stats = SimpleNamespace(record_error=lambda stage, error: errors.append(stage))
    window = CacheWindow(source["cache_stats"], lambda error: None)
    families = _families(("compile_cache", "memory"), window=window, stats=stats, **source)
    families.source.attribution.host_read("item", "train.py:7", None, 0, 0)
    scraped = _scrape(families)
    record = {"memory_stats": "memory", "cache_stats": "compile_cache"}[next(iter(broken))]
    assert scraped[("neuron_exporter_torchneuron_readable", record)] == 0
    other = "memory" if record == "compile_cache" else "compile_cache"
    assert scraped[("neuron_exporter_torchneuron_readable", other)] == 1
    assert scraped[("torchneuron_host_reads_total", "item", "train.py:7")] == 1
    assert ("torchneuron_memory_allocated_bytes",) in scraped or record == "memory"
    assert ("torchneuron_compile_cache_hits_total", "memory") in scraped or record == "compile_cache"
    assert errors == ["scrape"]


def test_graph_fallbacks_are_counted_by_a_filter_that_lets_every_record_through(caplog):
    counter = GraphFallbacks()
    logger = logging.getLogger(BACKEND_LOGGER)
    counter.install()
    try:
        assert logger.handlers == []  # a handler would stop logging.lastResort from printing TorchNeuron's warnings
        with caplog.at_level(logging.WARNING):
            logger.warning("Execution failed: NEFF 0x1f load error 42")
            logger.warning("Falling back to original GraphModule execution")
        assert [record.getMessage()[:16] for record in caplog.records] == ["Execution failed", "Falling back to "]
        assert counter.snapshot()[0] == {"NEFF N load error N": 1}
    finally:
        counter.uninstall()
    assert counter not in logger.filters


def test_torchneuron_warnings_still_reach_stderr_without_logging_setup():
    code = textwrap.dedent(f"""
        import logging
        from neuron_exporter.training.neuron.compiles import GraphFallbacks
        counter = GraphFallbacks()
        counter.install()
        logging.getLogger({BACKEND_LOGGER!r}).warning("Falling back to original GraphModule execution")
        print(counter.snapshot()[0])
    """)
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=Path(__file__).parents[2]
    )
    assert done.returncode == 0, done.stderr
    assert "Falling back to original GraphModule execution" in done.stderr
    assert done.stdout.strip() == "{'unknown': 1}"
