"""Counters stay exact when many clients scrape at once (an HA pair of Prometheus servers, the spool thread)."""

from __future__ import annotations

import itertools
import json
import sys
import threading

import pytest

from neuron_exporter.node.spool_reader import read_rank_file
from neuron_exporter.snapshot import Snapshot
from neuron_exporter.training.xla.reader import MonotonicSnapshots
from tests.support.exposition import samples, value
from tests.support.paths import SCRIPTS
from tests.support.processes import run_python
from tests.support.rank_files import only_rank_file

pytestmark = pytest.mark.training

STEPS = 200
SCRAPERS = 8


def test_exported_counters_equal_torch_xla_under_concurrent_scrapes(tmp_path):
    result = run_python(SCRIPTS / "concurrent_scrapes.py", str(STEPS), str(SCRAPERS), str(tmp_path))
    assert result.returncode == 0, result.stderr[-4000:]
    assert "Traceback" not in result.stderr
    report = json.loads(result.stdout.splitlines()[-1])
    assert report["scrapes"] >= SCRAPERS  # the scrapers really ran while the loop trained
    own = {name: count for name, count in report["xla"].items() if count}
    assert own["CreateXlaTensor"] > STEPS
    exported = {
        dict(labels)["counter"]: v
        for (name, labels), v in samples(report["scrape"]).items()
        if name == "xla_events_total"
    }
    for name, count in own.items():
        if name.startswith(("aten::", "xla::")):
            continue  # exported as op families, checked below
        assert exported.get(name) == count, name
    spooled = read_rank_file(only_rank_file(tmp_path, "0"))
    assert spooled.meta.finished
    final = spooled.exposition.decode()
    for name in ("CreateXlaTensor", "MarkStep", "UncachedCompile"):
        assert value(final, "xla_events_total", counter=name) == own[name], name


def test_concurrent_reads_never_inflate_totals():
    """Readers that race on a source that only grows: every total they see is a value the source had."""
    source = itertools.count(1)
    source_lock = threading.Lock()

    def read() -> Snapshot:
        with source_lock:
            return Snapshot(counters={"X": next(source)})

    totals = MonotonicSnapshots()
    seen: list[int] = []

    def reader():
        for _ in range(2000):
            seen.append(totals.read(read).counters["X"])

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=reader) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(old)
    assert max(seen) == 8 * 2000


def test_a_clear_keeps_counting_from_the_last_total():
    totals = MonotonicSnapshots()
    assert totals.apply(Snapshot(counters={"X": 100})).counters["X"] == 100
    assert totals.apply(Snapshot(counters={"X": 3})).counters["X"] == 103  # cleared, then 3 more
    assert totals.apply(Snapshot(counters={})).counters["X"] == 103  # cleared again: vanished from the list
