"""Diagnosis documents from elsewhere are checked field by field: a bad rank's document is left out with one log
line and the others served, in strict JSON; ``diagnose`` answers a bad page with one line; a rank's own document
is kept under the reader's cap."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import pytest

from neuron_exporter import diagnosis
from neuron_exporter.node.spool_format import RankMeta
from neuron_exporter.node.spool_writer import release_rank_lock, write_rank_file
from neuron_exporter.training.attribution import Attribution
from tests.scripts.spool_writer import rank_exposition
from tests.support.daemon import Daemon
from tests.support.diagnosis_documents import document, rank_document
from tests.support.diagnosis_page import diagnose, serving
from tests.support.exposition import scrape
from tests.support.paths import ROOT

# (JSON of a bad document, the line loads gives for it)
BAD = [
    (
        json.dumps(document()).replace('"steps": 120', '"steps": 1e400'),
        "ranks[0].steps: not a finite number from 0 to 2^63: inf",
    ),
    (
        json.dumps(document()).replace('"compile_seconds": 1.5', '"compile_seconds": NaN'),
        "ranks[0].torch_compile.compile_seconds: not a finite number from 0 to 2^63: nan",
    ),
    (
        json.dumps(document()).replace('"graph_cuts": 120', '"graph_cuts": -1'),
        "ranks[0].graph_cuts: not a finite number from 0 to 2^63: -1",
    ),
    (json.dumps(document(new_graphs=True)), "ranks[0].new_graphs: not a finite number from 0 to 2^63: True"),
    (
        json.dumps(document(sites=[{**rank_document()["sites"][0], "recompilation_causes": {"a": 1}}])),
        "ranks[0].sites[0].recompilation_causes: not a list",
    ),
    (
        json.dumps(document(cpu_fallback_ops={"aten::x": "7"})),
        "ranks[0].cpu_fallback_ops['aten::x']: not a finite number from 0 to 2^63: a str",
    ),
    (
        json.dumps(document(sites=[{"location": "x" * (diagnosis.MAX_TEXT + 1)}])),
        f"ranks[0].sites[0].location: a string of more than {diagnosis.MAX_TEXT} characters",
    ),
    (json.dumps(document(rank="\x1b[31m0")), "ranks[0].rank: a string with a character that is not printable"),
    (
        json.dumps(document(sites=[{"location": "a", "frames": ["f"] * (diagnosis.MAX_FRAMES + 1)}])),
        f"ranks[0].sites[0].frames: more than {diagnosis.MAX_FRAMES} entries",
    ),
    (json.dumps(document(sites=[{"graph_cuts": {}}])), "ranks[0].sites[0]: no location"),
    (json.dumps(document(torch_compile={"functions": [7]})), "ranks[0].torch_compile.functions[0]: not an object"),
    ('{"format": 1, "ranks": {}}', "ranks: not a list"),
    ('{"format": 1}', "the document: no ranks"),
]


@pytest.mark.parametrize("data, reason", BAD, ids=[reason.split(":")[0] for _, reason in BAD])
def test_a_bad_field_is_one_line_naming_the_file_and_the_field(data, reason):
    with pytest.raises(diagnosis.DiagnosisError) as error:
        diagnosis.loads(data.encode(), "rank-0.diagnosis.json")
    assert str(error.value) == f"rank-0.diagnosis.json: {reason}"


def test_a_good_document_reads_back_as_written_without_unknown_fields():
    good = document()
    assert diagnosis.loads(json.dumps(good).encode(), "x") == good
    extra = document(future_field={"a": float("nan")})
    extra["ranks"][0]["sites"][0]["other"] = [1, 2]
    assert diagnosis.loads(json.dumps(extra).encode(), "x") == good
    with pytest.raises(ValueError):
        diagnosis.dumps({"ranks": [{"steps": float("inf")}]})


def test_a_rank_with_1000_sites_of_4_long_frames_stays_under_the_cap():
    attribution = Attribution()
    long = "/a/long/path/to/a/virtual/environment/lib/python3.11/site-packages/" * 3
    for n in range(1000):
        frames = [f"function_{k} ({long}module_{n}_{k}.py:{n})" for k in range(4)]
        attribution.host_read("item", f"{long}train_{n}.py:{n}", frames, graphs=n, compiles=0)
    full = {
        "format": diagnosis.FORMAT,
        "ranks": [attribution.diagnosis({"run_id": "r", "rank": "0", "local_rank": "0"}, 100, {})],
    }
    assert len(json.dumps(full)) > diagnosis.MAX_BYTES  # what a rank wrote before

    fitted = diagnosis.fit(full)
    data = json.dumps(fitted).encode()
    assert len(data) <= diagnosis.MAX_BYTES and diagnosis.loads(data, "x") == fitted
    (rank,) = fitted["ranks"]
    assert rank["trimmed"].startswith("frames cut to one per site")
    assert all(len(site["frames"]) == 1 for site in rank["sites"])
    assert "Rank 0: frames cut to one per site" in diagnosis.render_text(fitted)

    # Half the room: sites are left out too, the least costly first.
    half = diagnosis.fit(full, diagnosis.MAX_BYTES // 2)
    (rank,) = half["ranks"]
    assert len(json.dumps(half)) <= diagnosis.MAX_BYTES // 2
    kept = {site["location"] for site in rank["sites"]}
    assert 0 < len(kept) < 1000 and f"{long}train_999.py:999" in kept and f"{long}train_1.py:1" not in kept
    assert f"{1000 - len(kept)} of 1000 sites left out (the least costly)" in rank["trimmed"]
    assert diagnosis.fit(document()) == document()  # a small one is left as it is


def diagnosis_bytes(rank: str, run_id: str, **fields) -> bytes:
    return json.dumps({"format": 1, "ranks": [{**rank_document(rank, run_id), **fields}]}).encode()


def write_bad_diagnosis(directory, rank: str, run_id: str, data: bytes) -> None:
    meta = RankMeta.current(rank, rank, run_id=run_id)
    write_rank_file(directory, meta, rank_exposition(rank, 3, 1, run_id), diagnosis=data)


def test_the_daemon_leaves_out_a_bad_rank_document_with_one_log_line_and_serves_the_others(tmp_path, daemons):
    spool, run_id = tmp_path / "spool", f"diag-{uuid.uuid4().hex[:8]}"
    bad = diagnosis_bytes("1", run_id).replace(b'"steps": 120', b'"steps": 1e400')
    write_bad_diagnosis(spool, "0", run_id, diagnosis_bytes("0", run_id))
    write_bad_diagnosis(spool, "1", run_id, bad)
    write_bad_diagnosis(
        spool, "2", run_id, diagnosis_bytes("2", run_id, sites=[{"location": "a", "new_graphs": float("nan")}])
    )
    try:
        daemon = Daemon(tmp_path, "--addr", "127.0.0.1", "--port", "0", "--spool-dir", str(spool))
        daemons(daemon)
        base = daemon.url.replace("/metrics", "/diagnosis")
        for _ in range(2):  # the rejection is logged once
            text = scrape(base)
            page = scrape(base + "?format=json")
        assert text.startswith("Diagnosis of 1 rank: what to fix first.\n")
        strict = json.loads(page, parse_constant=lambda name: pytest.fail(f"{name} in the JSON"))
        assert [rank["rank"] for rank in strict["ranks"]] == ["0"]
        result = subprocess.run(
            [sys.executable, "-m", "neuron_exporter", "diagnose", daemon.url],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=60,
        )
        assert result.returncode == 0 and result.stdout == text, result.stderr
        daemon.stop()
        lines = [line for line in daemon.log.read_text().splitlines() if ": ranks[0]." in line]
        assert len(lines) == 2, lines
        assert any("ranks[0].steps: not a finite number from 0 to 2^63: inf" in line for line in lines), lines
        assert any("ranks[0].sites[0].new_graphs: not a finite number from 0 to 2^63: nan" in line for line in lines), (
            lines
        )
    finally:
        for rank in "012":
            release_rank_lock(spool, rank, run_id)


@pytest.mark.parametrize(
    "body",
    [
        b'{"format": 1, "ranks": [{"rank": "0", "steps": 1e400, "sites": []}]}',
        b'{"format": 1, "ranks": [{"rank": "0", "sites": [{"location": "a", "recompilations": NaN}]}]}',
        b'{"format": 1, "ranks": [{"rank": "0", "sites": [{"location": "a", "recompilation_causes": 3}]}]}',
        b'{"format": 1, "ranks": [{"rank": "\\ud800"}]}',
    ],
)
@pytest.mark.parametrize("output", ["text", "json"])
def test_diagnose_answers_a_bad_page_with_one_line_and_exit_2(body, output):
    with serving(body) as url:
        result = diagnose(url, "--format", output)
    assert result.returncode == 2 and result.stdout == "", result
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.startswith(f"neuron-exporter diagnose: {url}: ") and "ranks[0]." in result.stderr


def test_a_diagnosis_file_over_the_cap_is_left_out_in_one_line(tmp_path, caplog):
    import logging

    from neuron_exporter.config import resolve_options
    from neuron_exporter.node.node_view import NodeView
    from neuron_exporter.node.spool_format import RankMeta
    from neuron_exporter.node.spool_writer import release_rank_lock, write_rank_file

    exposition = (
        b"# HELP xla_steps_total Steps\n# TYPE xla_steps_total counter\n"
        b'xla_steps_total{local_rank="0",rank="0",run_id="test-run"} 1.0\n'
    )
    try:
        write_rank_file(tmp_path, RankMeta.current("0", "0"), exposition, diagnosis=b" " * (diagnosis.MAX_BYTES + 1))
        view = NodeView(resolve_options(env={}, overrides={"spool_dir": str(tmp_path)}))
        with caplog.at_level(logging.WARNING, logger="neuron_exporter"):
            assert view.diagnosis()["ranks"] == [] and view.diagnosis()["ranks"] == []
    finally:
        release_rank_lock(tmp_path, "0")
    lines = [r.getMessage() for r in caplog.records if "diagnosis of rank-0" in r.getMessage()]
    assert len(lines) == 1 and "more than the" in lines[0]


def test_the_diagnosis_opens_with_each_runs_goodput_and_its_largest_badput_phases():
    ranks = [
        {"run_id": "a", "rank": "0", "time_phases": {"step": 30.0, "compile": 50.0, "data": 10.0, "startup": 10.0}},
        {"run_id": "a", "rank": "1", "time_phases": {"step": 50.0, "compile": 30.0, "host_sync": 20.0}},
        {"run_id": "b", "rank": "0", "time_phases": {"step": 90.0, "checkpoint": 10.0}},
        {"run_id": "c", "rank": "0"},  # an exporter from before goodput: no line
    ]
    checked = diagnosis.loads(json.dumps({"format": 1, "ranks": ranks}).encode(), "a test")
    lines = diagnosis.render_text(checked).splitlines()
    assert lines[1:3] == [
        "Run a, 2 ranks: goodput 0.40 | compile 40% host_sync 10% data 5%",
        "Run b, 1 rank: goodput 0.90 | checkpoint 10%",
    ]
    assert lines[3] == "" or not lines[3].startswith("Run")


def test_the_diagnosis_names_a_runs_restarts_its_lost_work_and_the_rank_that_holds_it_back():
    def rank(number: int, data: float, restarts: int = 1, lost: float = 5.0) -> dict:
        phases = {"step": 80.0 - data, "data": data, "recovery": 10.0, "startup": 10.0}
        return {"run_id": "r", "rank": str(number), "steps": 100, "time_phases": phases, "restarts": restarts,
                "lost_seconds": lost}  # fmt: skip

    ranks = [rank(0, 2.0), rank(1, 2.0), rank(2, 22.0), rank(3, 2.5)]  # rank 2 waits 0.2 s more per step for data
    checked = diagnosis.loads(json.dumps({"format": 1, "ranks": ranks}).encode(), "a test")
    lines = diagnosis.render_text(checked).splitlines()
    assert lines[1] == "Run r, 4 ranks: goodput 0.68 | recovery 10% startup 10% data 7% lost work 5%"
    assert lines[2].startswith("Run r restarted: 1 time (ranks 0, 1, 2, 3); 40.0 s of its ranks' time between")
    assert "20.0 s of steps done again" in lines[2]
    assert lines[3].startswith("Run r is held back by rank 2: its data takes 20% of the run's time per step more")
    balanced = [rank(number, 2.0, restarts=0, lost=0.0) for number in range(4)]
    lines = diagnosis.render_text(
        diagnosis.loads(json.dumps({"format": 1, "ranks": balanced}).encode(), "a")
    ).splitlines()
    assert not any("restarted" in line or "held back" in line for line in lines)


def test_the_diagnosis_tells_a_runs_throughput_and_its_mfu_or_that_its_peak_is_wrong():
    def rank(number: int, peak: float) -> dict:
        work = {"samples": 1000, "tokens": 64000, "flops": 4e15, "seconds": 100.0, "peak_flops": peak}
        return {"run_id": "t", "rank": str(number), "time_phases": {"step": 100.0}, "throughput": work}

    def lines_of(ranks: list[dict]) -> list[str]:
        return diagnosis.render_text(
            diagnosis.loads(json.dumps({"format": 1, "ranks": ranks}).encode(), "a")
        ).splitlines()

    assert lines_of([rank(0, 2e14), rank(1, 2e14)])[2] == (
        "Run t since its processes started: 20.0 samples/s, 1,280 tokens/s, 80 TFLOP/s, MFU 20.0%."
    )
    assert "MFU over 100%: the peak (20 TFLOP/s) is wrong" in lines_of([rank(0, 1e13), rank(1, 1e13)])[2]
    unknown = lines_of([rank(0, 2e14), {**rank(1, 0), "throughput": {"samples": 5, "flops": 1e15, "seconds": 10}}])
    assert "MFU" not in unknown[2]  # a rank without a peak: no share of an unknown whole
