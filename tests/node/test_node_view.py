"""The node endpoint's rendering: every rank merged, liveness per rank, host metrics, promtool-clean."""

from __future__ import annotations

import os
import subprocess
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from neuron_exporter.config import resolve_options
from neuron_exporter.node.node_view import STATES, NodeView, merge_families, split_families
from neuron_exporter.node.spool_format import RankMeta
from tests.scripts.spool_writer import rank_exposition
from tests.support.exposition import samples, uncatalogued, value
from tests.support.paths import ROOT
from tests.support.processes import wait_until
from tests.support.rank_files import rank_file
from tests.support.spool_writer import Writer

DEPLOY_README = ROOT / "deploy" / "README.md"


def view(spool_dir, **options) -> NodeView:
    return NodeView(resolve_options(env={}, overrides={"spool_dir": str(spool_dir), **options}))


def age(path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def state_of(text: str, rank: str) -> str | None:
    states = [
        s for s in ("running", "hung", "dead") if value(text, "neuron_exporter_rank_state", rank=rank, state=s) == 1.0
    ]
    assert len(states) <= 1
    return states[0] if states else None


def promtool_check(text: str) -> None:
    result = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_merge_keeps_one_header_per_family_and_every_sample():
    expositions = [rank_exposition("0", 3, 2), rank_exposition("1", 7, 3), b""]
    merged = merge_families([split_families(text) for text in expositions]).decode()
    assert merged.count("# HELP xla_steps_total ") == 1
    assert merged.count("# TYPE xla_steps_total counter") == 1
    assert value(merged, "xla_steps_total", rank="0") == 3
    assert value(merged, "xla_steps_total", rank="1") == 7
    ops = [k for k in samples(merged) if k[0] == "xla_cpu_fallback_ops_total"]
    assert len(ops) == 5
    # every family's samples stay together (the text format requires it)
    names = [f.name for f in text_string_to_metric_families(merged)]
    assert len(names) == len(set(names))
    promtool_check(merged)


def test_merge_takes_the_header_from_the_first_and_samples_from_all():
    a = b'# HELP x_total first help\n# TYPE x_total counter\nx_total{rank="0"} 1.0\n'
    b = b'# HELP x_total other help\n# TYPE x_total counter\nx_total{rank="1"} 2.0\n# HELP y a\n# TYPE y gauge\ny 1.0\n'
    assert merge_families([split_families(a), split_families(b)]) == (
        b"# HELP x_total first help\n# TYPE x_total counter\n"
        b'x_total{rank="0"} 1.0\nx_total{rank="1"} 2.0\n'
        b"# HELP y a\n# TYPE y gauge\ny 1.0\n"
    )


def test_every_live_rank_is_served_and_running(tmp_path):
    with Writer(tmp_path, "0-3", "--steps", "11", "--ops", "3"):
        text = view(tmp_path).render().decode()
    for rank in "0123":
        assert value(text, "xla_steps_total", rank=rank) == 11
        assert value(text, "neuron_exporter_rank_up", rank=rank, local_rank=rank) == 1
        assert state_of(text, rank) == "running"
        assert abs(value(text, "neuron_exporter_rank_last_report_timestamp_seconds", rank=rank) - time.time()) < 300
    assert value(text, "neuron_exporter_ranks") == 4
    assert value(text, "neuron_exporter_host_memory_total_bytes") > 0
    assert (
        0
        < value(text, "neuron_exporter_host_memory_available_bytes")
        <= value(text, "neuron_exporter_host_memory_total_bytes")
    )
    assert value(text, "neuron_exporter_host_cpu_seconds_total", mode="idle") > 0
    assert uncatalogued(text, check_help=False) == []
    promtool_check(text)


def test_a_killed_rank_is_dead_and_keeps_its_last_counters(tmp_path):
    with Writer(tmp_path, "0", "--steps", "5"), Writer(tmp_path, "1", "--steps", "9") as victim:
        victim.kill()
        text = view(tmp_path).render().decode()
    assert state_of(text, "1") == "dead"
    assert value(text, "neuron_exporter_rank_up", rank="1") == 0
    assert value(text, "xla_steps_total", rank="1") == 9
    assert state_of(text, "0") == "running"
    assert value(text, "neuron_exporter_ranks") == 2
    promtool_check(text)


def test_a_silent_live_rank_is_hung(tmp_path):
    with Writer(tmp_path, "0"), Writer(tmp_path, "1"):
        age(rank_file(tmp_path, "1"), 120)  # no report for 2 minutes, before any step
        text = view(tmp_path, hung_after_seconds=60).render().decode()
    assert state_of(text, "1") == "hung" and value(text, "neuron_exporter_rank_up", rank="1") == 0
    assert value(text, "xla_steps_total", rank="1") == 5
    assert state_of(text, "0") == "running"


def test_a_rank_that_reports_but_makes_no_step_is_hung(tmp_path):
    # the spool thread keeps writing, but the training loop has not ended a step for 90 s
    with Writer(tmp_path, "0", "--last-step-age", "90"), Writer(tmp_path, "1", "--last-step-age", "1"):
        text = view(tmp_path, hung_after_seconds=60).render().decode()
        assert state_of(text, "0") == "hung"
        assert state_of(text, "1") == "running"
        last = value(text, "neuron_exporter_rank_last_report_timestamp_seconds", rank="0")
        assert 80 < time.time() - last < 400


def test_a_rank_stuck_before_its_first_step_is_hung_however_often_it_reports(tmp_path):
    # Stuck in a first collective or compilation: its spool thread rewrites its file all the same.
    with Writer(tmp_path, "0", "--rewrite", "0.05"):
        node = view(tmp_path, hung_after_seconds=2)
        wait_until(lambda: state_of(node.render().decode(), "0") == "hung", what="rank 0 to be hung")
        assert time.time() - rank_file(tmp_path, "0").stat().st_mtime < 60  # it still reports


def test_dead_ranks_are_not_served_after_the_expiry(tmp_path):
    with Writer(tmp_path, "0"), Writer(tmp_path, "1,2") as gone:
        gone.kill()
        age(rank_file(tmp_path, "1"), 7200)
        text = view(tmp_path, expire_after_seconds=3600).render().decode()
    assert value(text, "xla_steps_total", rank="1") is None
    assert value(text, "neuron_exporter_rank_up", rank="1") is None
    assert state_of(text, "2") == "dead"
    assert value(text, "neuron_exporter_ranks") == 2


def test_a_finished_rank_keeps_its_values_without_liveness(tmp_path):
    with Writer(tmp_path, "0", "--finished", "--steps", "40"):
        text = view(tmp_path).render().decode()
    assert value(text, "xla_steps_total", rank="0") == 40
    assert value(text, "neuron_exporter_rank_up", rank="0") is None
    assert state_of(text, "0") is None
    assert value(text, "neuron_exporter_rank_last_report_timestamp_seconds", rank="0") is not None
    promtool_check(text)


def test_the_ranks_count_says_what_it_counts_as_the_docs_do(tmp_path):
    """A finished rank is served and counted: the HELP and the docs' row name every state a served rank is in."""
    with Writer(tmp_path, "0", "--finished", "--steps", "4"):
        text = view(tmp_path).render().decode()
    assert value(text, "neuron_exporter_ranks") == 1
    (help_text,) = [f.documentation for f in text_string_to_metric_families(text) if f.name == "neuron_exporter_ranks"]
    row = next(line for line in DEPLOY_README.read_text().splitlines() if line.startswith("| `neuron_exporter_ranks`"))
    for state in (*STATES, "finished"):
        assert state in help_text and state in row


def test_the_serving_process_uses_its_own_exposition_over_its_file(tmp_path):
    with Writer(tmp_path, "0,1", "--steps", "3"):
        own_meta = {"rank": "0", "local_rank": "0", "pid": os.getpid(), "start_time": 1.0}
        text = view(tmp_path).render(own=(own_meta, rank_exposition("0", 8, 1))).decode()
    assert value(text, "xla_steps_total", rank="0") == 8  # not the 3 of the file
    assert value(text, "xla_steps_total", rank="1") == 3
    assert state_of(text, "0") == "running" and state_of(text, "1") == "running"
    assert value(text, "neuron_exporter_ranks") == 2


def test_the_serving_process_is_hung_when_its_loop_makes_no_step(tmp_path):
    own = (RankMeta.current("0", "0", last_step_time=time.time() - 300), rank_exposition("0", 8, 1))
    text = view(tmp_path, hung_after_seconds=60).render(own=own).decode()
    assert state_of(text, "0") == "hung"


def test_the_serving_process_is_hung_when_it_compiled_but_never_steps(tmp_path):
    own = (RankMeta.current("0", "0"), rank_exposition("0", 0, 1))  # a claimed rank (it compiled), no step yet
    node = view(tmp_path, hung_after_seconds=1)
    wait_until(lambda: state_of(node.render(own=own).decode(), "0") == "hung", what="rank 0 to be hung")


def test_a_serving_process_that_has_not_claimed_its_rank_gives_way_to_the_worker_that_does(tmp_path):
    own = (RankMeta.current("0", "0"), rank_exposition("0", 0, 1))  # attached, no step, no compilation
    node = view(tmp_path, hung_after_seconds=1)
    wait_until(lambda: state_of(node.render(own=own, own_idle=True).decode(), "0") == "hung", what="rank 0 hung")
    with Writer(tmp_path, "0", "--steps", "4"):  # the worker a launcher started, as rank 0
        text = view(tmp_path).render(own=own, own_idle=True).decode()
    assert value(text, "xla_steps_total", rank="0") == 4 and state_of(text, "0") == "running"
    assert value(text, "neuron_exporter_ranks") == 1


def test_an_empty_or_missing_spool_still_renders(tmp_path):
    text = view(tmp_path / "missing").render().decode()
    assert value(text, "neuron_exporter_ranks") == 0
    promtool_check(text)


@pytest.mark.parametrize("bad", [b"", b"garbage\nmore", b'{"format":1}\n'])
def test_a_broken_file_is_skipped(tmp_path, bad):
    (rank_file(tmp_path, "7")).write_bytes(bad)
    with Writer(tmp_path, "0"):
        text = view(tmp_path).render().decode()
    assert value(text, "neuron_exporter_ranks") == 1


def test_the_files_of_runs_that_are_gone_are_not_held(tmp_path):
    """Runs come and go (or a local user lays files and removes them): what a render keeps of a file's split
    families lasts only while the file is served, or the endpoint's memory grows with every file it ever saw."""
    node = view(tmp_path)
    for round_ in range(3):
        with Writer(tmp_path, "0,1"):
            assert value(node.render().decode(), "xla_steps_total", rank="1") is not None
        for path in tmp_path.glob("rank-*"):
            path.unlink()
        node.render()
        assert node._split == {}, round_  # nothing left of the files removed


def test_dead_ranks_whose_files_lie_in_the_future_still_expire(tmp_path):
    # The clock was set back after they died: their files' times lie a day ahead.
    with Writer(tmp_path, "1,2") as gone:
        gone.kill()
        for rank in "12":
            age(rank_file(tmp_path, rank), -86400)
        node = view(tmp_path, expire_after_seconds=1)
        text = node.render().decode()
        assert state_of(text, "1") == "dead" and value(text, "neuron_exporter_ranks") == 2
        wait_until(lambda: value(node.render().decode(), "neuron_exporter_ranks") == 0, what="the dead ranks expired")
        assert value(node.render().decode(), "xla_steps_total", rank="1") is None


def test_a_rank_whose_last_step_lies_in_the_future_is_hung_once_it_stops_stepping(tmp_path):
    # The clock was set back an hour after its last step, and it has made no step since.
    with Writer(tmp_path, "0", "--last-step-age", "-3600"), Writer(tmp_path, "1", "--last-step-age", "-3600"):
        node = view(tmp_path, hung_after_seconds=1)
        text = node.render().decode()
        assert state_of(text, "0") == "running"
        assert value(text, "neuron_exporter_rank_last_report_timestamp_seconds", rank="0") <= time.time()
        wait_until(lambda: state_of(node.render().decode(), "0") == "hung", what="rank 0 to be hung")


def test_a_rank_first_seen_after_it_stopped_is_judged_from_when_its_file_was_written(tmp_path):
    # Its last step lies an hour ahead (the clock set back since), and its file was last written 8 s ago: the step
    # came no later than that, however late the endpoint first reads the file.
    with Writer(tmp_path, "0", "--last-step-age", "-3600"):
        age(rank_file(tmp_path, "0"), 8)
        text = view(tmp_path, hung_after_seconds=2).render().decode()
        assert state_of(text, "0") == "hung"
        written = rank_file(tmp_path, "0").stat().st_mtime
        assert value(text, "neuron_exporter_rank_last_report_timestamp_seconds", rank="0") == written


def test_a_rank_that_steps_with_its_clock_set_back_stays_running(tmp_path):
    # Its last step time lies ahead of now, and changes at every report: it makes progress.
    with Writer(tmp_path, "0", "--last-step-age", "-3600", "--rewrite", "0.05"):
        node = view(tmp_path, hung_after_seconds=3)
        start = time.monotonic()
        while time.monotonic() - start < 4:  # past the hang threshold, on the endpoint's clock, while it steps
            assert state_of(node.render().decode(), "0") == "running"
