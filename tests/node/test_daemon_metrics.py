"""The daemon's own metrics: ``neuron-exporter serve`` shows its version and process beside the ranks' series,
without a name or a series that clashes with theirs, and promtool accepts the whole page."""

from __future__ import annotations

import os
import platform
import subprocess

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from neuron_exporter import __version__
from neuron_exporter.config import resolve_options
from neuron_exporter.node.node_view import NodeView
from neuron_exporter.node.spool_format import RankMeta
from neuron_exporter.node.spool_writer import write_rank_file
from tests.support.daemon import Daemon
from tests.support.exposition import scrape
from tests.support.paths import RUN

RANK_INFO = {
    "version": __version__,
    "torch_version": "2.9.0",
    "torch_xla_version": "2.9.0",
    "python_version": platform.python_version(),
}
PROCESS_FAMILIES = {
    "process_cpu_seconds",
    "process_resident_memory_bytes",
    "process_virtual_memory_bytes",
    "process_start_time_seconds",
    "process_open_fds",
    "process_max_fds",
}


def rank_exposition(rank: str) -> bytes:
    """What a rank writes, in short: its steps, its process, and its build_info."""
    registry = CollectorRegistry()
    labels = {"run_id": RUN, "rank": rank, "local_rank": rank}
    Counter("xla_steps", "Steps ended", list(labels), registry=registry).labels(**labels).inc(5)
    Gauge("xla_process_resident_memory_bytes", "Resident memory", list(labels), registry=registry).labels(**labels).set(
        1e9
    )
    Gauge(
        "neuron_exporter_build_info",
        "Versions of the exporter and of what it runs with",
        list(labels) + list(RANK_INFO),
        registry=registry,
    ).labels(**labels, **RANK_INFO).set(1)
    return generate_latest(registry)


def families(text: str) -> dict:
    return {family.name: family for family in text_string_to_metric_families(text)}


def test_serve_shows_its_version_and_process_beside_the_ranks(tmp_path):
    spool = tmp_path / "spool"
    for rank in ("0", "1"):
        write_rank_file(spool, RankMeta.current(rank, rank), rank_exposition(rank))
    daemon = Daemon(tmp_path, "--addr", "127.0.0.1", "--port", "0", "--spool-dir", str(spool))
    try:
        text = scrape(daemon.url)
    finally:
        assert daemon.stop() == 0
    found = families(text)
    assert PROCESS_FAMILIES <= set(found)
    assert not any(name.startswith("process_") for name in found if name not in PROCESS_FAMILIES)
    info = {frozenset(sample.labels.items()): sample.value for sample in found["neuron_exporter_build_info"].samples}
    daemon_info = frozenset({"version": __version__, "python_version": platform.python_version()}.items())
    assert info == {
        daemon_info: 1.0,
        **{frozenset({"run_id": RUN, "rank": r, "local_rank": r, **RANK_INFO}.items()): 1.0 for r in "01"},
    }
    # each family once: one HELP and one TYPE line, all its samples together
    for header in ("# HELP ", "# TYPE "):
        names = [line.split()[2] for line in text.splitlines() if line.startswith(header)]
        assert len(names) == len(set(names)), header
    check = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    # the process is the daemon's own, not a rank's
    start = found["process_start_time_seconds"].samples[0]
    assert start.labels == {}
    assert found["process_resident_memory_bytes"].samples[0].value != 1e9


def test_a_rank_serving_the_node_view_adds_no_process_of_its_own(tmp_path):
    view = NodeView(resolve_options(env={}, overrides={"spool_dir": str(tmp_path)}))
    own = ({"rank": "0", "local_rank": "0", "pid": os.getpid(), "start_time": 1.0}, rank_exposition("0"))
    found = families(view.render(own=own).decode())
    assert not {name for name in found if name.startswith("process_")}
    assert [sample.labels["rank"] for sample in found["neuron_exporter_build_info"].samples] == ["0"]
