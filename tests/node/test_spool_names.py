"""File names in the spool are input like any other: a name the reader cannot order or parse is one rejected file,
never a failed scrape; numbers in names and in diagnoses are ASCII digits only."""

from __future__ import annotations

import json
import os
import urllib.request

import pytest

from neuron_exporter import diagnosis
from neuron_exporter.config import resolve_options
from neuron_exporter.node.node_view import NodeView
from tests.support.daemon import Daemon
from tests.support.diagnosis_documents import rank_document
from tests.support.diagnosis_page import diagnose, serving
from tests.support.exposition import samples, total, value
from tests.support.fuzz import FUZZ_CASES, cases
from tests.support.paths import RUN
from tests.support.rank_files import rank_file_bytes, steps_exposition
from tests.support.spool_writer import Writer

# Characters Python calls digits (str.isdigit) that int() refuses, or that are digits of another script.
NOT_ASCII_DIGITS = ["²", "³", "¹", "٣", "۳", "߃", "१", "①", "𝟘", "1²"]


def lay_named(directory, names: list[bytes], content: bytes) -> None:
    for name in names:
        with open(os.path.join(os.fsencode(directory), name), "wb") as f:
            f.write(content)


def served_ranks(text: str) -> set[str | None]:
    return {dict(labels).get("rank") for (name, labels) in samples(text) if name == "xla_steps_total"}


def test_rank_order_takes_only_ascii_digits_as_numbers():
    ranks = ["10", "2", *NOT_ASCII_DIGITS, "0"]
    ordered = sorted(ranks, key=diagnosis.rank_order)
    assert ordered[:3] == ["0", "2", "10"] and sorted(ordered[3:]) == sorted(NOT_ASCII_DIGITS)


@pytest.mark.parametrize("rank", NOT_ASCII_DIGITS)
def test_a_rank_file_named_with_a_non_ascii_digit_is_one_rejected_file(tmp_path, rank):
    directory = tmp_path / "spool"
    with Writer(directory, "0,1"):
        # As a local user of a shared spool could lay it: the header names the rank "2", the file rank "²".
        lay_named(directory, [f"rank-{rank}.{RUN}.prom".encode()], rank_file_bytes("2", steps_exposition("2")))
        view = NodeView(resolve_options(env={}, overrides={"spool_dir": str(directory)}))
        text = view.render().decode()
        document = view.diagnosis()
    assert served_ranks(text) == {"0", "1"}
    assert value(text, "neuron_exporter_spool_rejected_files", reason="wrong_rank") == 1
    assert document["ranks"] == []  # the writer writes no diagnosis: nothing, and no failure


def test_the_daemon_answers_every_page_whatever_the_names_in_its_spool(tmp_path, daemons):
    directory = tmp_path / "spool"
    with Writer(directory, "0"):
        names = [f"rank-{rank}.{RUN}.prom".encode() for rank in NOT_ASCII_DIGITS]
        names += [
            b"rank-\xff\xfe.test-run.prom",  # not UTF-8
            b"rank-1." + b"9" * 240 + b".prom",  # as long as a name may be
            b"rank-" + b"1" * 245 + b".prom",
            b"rank-.prom",
            b"rank-..prom",
            b"rank-0.test-run.x.prom",
            b"rank-\n.test-run.prom",
            b"rank-\x1b[2J.test-run.prom",
            b"rank-0.test-run.diagnosis.json.prom",
        ]
        lay_named(directory, names, rank_file_bytes("0", steps_exposition("0")))
        daemon = Daemon(tmp_path, "--addr", "127.0.0.1", "--port", "0", "--spool-dir", str(directory))
        daemons(daemon)
        for page in ("/metrics", "/diagnosis", "/diagnosis?format=json"):
            with urllib.request.urlopen(daemon.url.replace("/metrics", page), timeout=30) as response:
                assert response.status == 200
        with urllib.request.urlopen(daemon.url, timeout=30) as response:
            text = response.read().decode()
    assert served_ranks(text) == {"0"}
    assert total(text, "neuron_exporter_spool_rejected_files") == len(names)
    log = daemon.log.read_text()
    assert "Traceback" not in log and "\x1b" not in log  # names are escaped in the log: one line each
    assert "rank-\\n.test-run.prom: " in log and "rank-\\udcff\\udcfe.test-run.prom" in log


def file_name_cases(count: int):
    """Mutated rank file names that a directory can hold (no '/', no NUL, at most 255 bytes)."""
    seeds = [f"rank-{rank}.{RUN}.prom".encode() for rank in ("0", "7", "10", "a%2Eb", "%C2%B2")]
    for case, name in cases(seeds, "spool-names", count):
        name = name.replace(b"/", b"_").replace(b"\x00", b"_")[:255]
        if name not in (b"", b".", b".."):
            yield case, name


def test_fuzz_the_spool_reader_with_file_names(tmp_path):
    directory = tmp_path / "spool"
    content = rank_file_bytes("3", steps_exposition("3"))
    batch: list[tuple[str, bytes]] = []
    with Writer(directory, "0"):
        view = NodeView(resolve_options(env={}, overrides={"spool_dir": str(directory)}))
        for index, (case, name) in enumerate(file_name_cases(FUZZ_CASES)):
            if name == f"rank-0.{RUN}.prom".encode() or name in {laid for _, laid in batch}:
                continue  # the live rank's own file, or a name laid already
            batch.append((case, name))
            lay_named(directory, [name], content)
            if len(batch) < 50 and index < FUZZ_CASES - 1:
                continue
            try:
                text = view.render().decode()
                view.diagnosis()
            except Exception as error:  # noqa: BLE001 - name the cases, to reproduce them
                pytest.fail(f"cases {[c for c, _ in batch]}: {error!r:.500}")
            assert "0" in served_ranks(text), [c for c, _ in batch]
            for _, laid in batch:
                os.unlink(os.path.join(os.fsencode(directory), laid))
            batch.clear()


@pytest.mark.parametrize("output", ["text", "json"])
def test_diagnose_prints_ranks_named_with_any_digit(output):
    ranks = [rank_document(rank, RUN) for rank in ["10", *NOT_ASCII_DIGITS, "2"]]
    with serving(diagnosis.dumps({"format": 1, "ranks": ranks}).encode()) as url:
        result = diagnose(url, "--format", output)
    assert result.returncode == 0 and result.stderr == "", result
    if output == "json":
        assert [rank["rank"] for rank in json.loads(result.stdout)["ranks"]] == [r["rank"] for r in ranks]
    else:
        assert "²" in result.stdout and "internal error" not in result.stdout
