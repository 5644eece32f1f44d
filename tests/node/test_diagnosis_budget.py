"""The node's /diagnosis within a budget: the ranks' diagnosis files count in the spool's, the merged page holds at
most ``diagnosis.MAX_PAGE_BYTES`` and says which ranks it left out, and ``diagnose`` reads what an endpoint serves."""

from __future__ import annotations

import json

from neuron_exporter import diagnosis
from neuron_exporter.config import resolve_options
from neuron_exporter.node.node_view import NodeView
from tests.support.daemon import Daemon
from tests.support.diagnosis_page import diagnose, serving
from tests.support.exposition import value
from tests.support.paths import RUN
from tests.support.spool_writer import Writer


def view(spool_dir, **options) -> NodeView:
    return NodeView(resolve_options(env={}, overrides={"spool_dir": str(spool_dir), **options}))


def notes(document: dict) -> dict[str, str]:
    return {rank["rank"]: rank["trimmed"] for rank in document["ranks"] if "trimmed" in rank}


def test_the_merged_page_holds_at_most_its_cap_and_names_the_ranks_left_out(tmp_path):
    ranks = 12  # 12 x 950 KB: more than a page holds
    with Writer(tmp_path, f"0-{ranks - 1}", "--diagnosis-bytes", "950000"):
        node = view(tmp_path)
        document = node.diagnosis()
        text = node.render().decode()
    page = diagnosis.dumps(document).encode()
    assert len(page) <= diagnosis.MAX_PAGE_BYTES
    assert [rank["rank"] for rank in document["ranks"]] == [str(r) for r in range(ranks)]  # every rank, in order
    left_out = notes(document)
    assert 0 < len(left_out) < ranks
    assert set(left_out.values()) == {f"left out: this page holds {diagnosis.MAX_PAGE_BYTES} bytes at most"}
    assert all(len(rank.get("sites", [])) > 1000 for rank in document["ranks"] if rank["rank"] not in left_out)
    assert diagnosis.loads(page, "page", diagnosis.MAX_PAGE_BYTES) == document
    assert f"Rank {next(iter(left_out))}: left out: this page holds" in diagnosis.render_text(document)
    assert value(text, "neuron_exporter_spool_rejected_files", reason="over_budget") == 0


def test_diagnosis_files_count_in_the_spool_budget(tmp_path):
    with Writer(tmp_path, "0-9", "--diagnosis-bytes", "300000"):
        node = view(tmp_path, spool_max_total_bytes=1_000_000)  # the ten rank files and three diagnoses
        document = node.diagnosis()
        text = node.render().decode()
    left_out = notes(document)
    assert sorted(left_out, key=int) == [str(r) for r in range(3, 10)]
    assert set(left_out.values()) == {"left out: past the spool budget (spool_max_total_bytes)"}
    assert value(text, "neuron_exporter_spool_rejected_files", reason="over_budget") == 7
    assert [value(text, "xla_steps_total", rank=str(r)) for r in range(10)] == [5.0] * 10  # metrics come first


def test_diagnose_reads_a_node_page_of_two_large_ranks(tmp_path, daemons):
    spool = tmp_path / "spool"
    with Writer(spool, "0,1", "--diagnosis-bytes", "669000"):
        daemon = Daemon(tmp_path, "--addr", "127.0.0.1", "--port", "0", "--spool-dir", str(spool))
        daemons(daemon)
        result = diagnose(daemon.url, "--format", "json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert [(rank["run_id"], rank["rank"]) for rank in document["ranks"]] == [(RUN, "0"), (RUN, "1")]
    assert len(result.stdout.encode()) > diagnosis.MAX_BYTES  # more than a rank's document: what was refused


def test_diagnose_refuses_more_than_a_page_in_one_line(tmp_path):
    with serving(b" " * (diagnosis.MAX_PAGE_BYTES + 1)) as url:
        result = diagnose(url)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1
    assert f"larger than a diagnosis page ({diagnosis.MAX_PAGE_BYTES} bytes)" in result.stderr
