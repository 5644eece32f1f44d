"""Fuzz: mutations of valid diagnosis documents, as a rank's file or an endpoint's page would carry them.

``diagnosis.loads`` raises nothing but DiagnosisError, whose message is one short printable line naming the source;
what it accepts renders as text, prints as UTF-8 and serializes as strict JSON that reads back the same.
"""

from __future__ import annotations

import json
import random

import pytest

from neuron_exporter import diagnosis
from tests.support.diagnosis_documents import document, rank_document
from tests.support.fuzz import FUZZ_CASES, cases

SOURCE = "rank-0.diagnosis.json"
SEEDS = [
    json.dumps(document()).encode(),
    json.dumps({"format": 1, "ranks": [rank_document(str(n), "run") for n in range(3)]}, indent=1).encode(),
    json.dumps({"format": 1, "ranks": [{"rank": "0", "sites": [], "trimmed": "frames cut"}]}).encode(),
]
# JSON values put in place of any value of a document: each breaks some field's type or bound.
NASTY_VALUES = [
    "NaN",
    "Infinity",
    "-Infinity",
    "1e400",
    "-1",
    "-0.0",
    "9223372036854775809",
    "true",
    "null",
    "[]",
    "{}",
    '"7"',
    '"\\u001b[2J"',
    '"\\ud800"',
    '"' + "x" * 5000 + '"',
    "[" + ", ".join(['"f"'] * 40) + "]",
    "[" * 200 + "]" * 200,
]


def replace_a_value(data: bytes, rng: random.Random) -> bytes:
    """``data`` with one of its values (after a ':' or in a list) replaced by a nasty one: the document stays
    JSON, so the fields are what is checked."""
    text = data.decode()
    places = [n for n, c in enumerate(text) if c in ":[,"]
    at = rng.choice(places) + 1
    end = at
    depth = 0
    while end < len(text) and (depth or text[end] not in ",]}"):
        depth += text[end] in "[{"
        depth -= text[end] in "]}"
        end += 1
    return (text[:at] + " " + rng.choice(NASTY_VALUES) + text[end:]).encode()


def check(data: bytes, case: str) -> bool:
    """True if ``loads`` accepted ``data``."""
    try:
        loaded = diagnosis.loads(data, SOURCE)
    except diagnosis.DiagnosisError as error:
        line = str(error)
        assert line.startswith(f"{SOURCE}: ") and line.isprintable() and len(line) <= 300, (case, line[:1000])
        return False
    except Exception as error:  # noqa: BLE001 - any other: fail naming the case, to reproduce it
        pytest.fail(f"case {case}: {error!r:.500}")
    diagnosis.render_text(loaded).encode()
    strict = diagnosis.dumps(loaded)
    assert diagnosis.loads(strict.encode(), SOURCE) == loaded, case
    return True


def test_fuzz_diagnosis_documents():
    accepted = 0
    for index, (case, data) in enumerate(cases(SEEDS, "diagnosis")):
        if index % 2:
            data = replace_a_value(random.Random(case).choice(SEEDS), random.Random(case))
        accepted += check(data, case)
    assert 0 < accepted < FUZZ_CASES  # some mutations keep a valid document, some do not: both paths ran
