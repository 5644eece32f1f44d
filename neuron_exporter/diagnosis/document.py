"""The diagnosis document: the detail that labels cannot carry, per rank and site, as JSON, and its checks.

A rank's document (``/diagnosis?format=json`` of a rank, and ``rank-R.diagnosis.json`` in the spool)::

    {"format": 1, "ranks": [{"rank": "0", "local_rank": "0", "pid": 42, "steps": 120, "graph_cuts": 120,
      "new_graphs": 3, "recompilations": 0, "cpu_fallback_ops": {"aten::lgamma": 120},
      "cpu_fallback_sites": [{"op": "aten::lgamma", "location": "train.py:38", "pass": "forward",
                              "frames": ["forward (train.py:38)"]}],
      "sites": [{"location": "train.py:42", "host_reads": {"item": 120}, "graph_cuts": {"item": 120},
                 "new_graphs": 1, "recompilations": 0, "frames": ["step (train.py:42)", "<module> (train.py:60)"],
                 "recompilation_causes": [{"uploads": {"train.py:30": {"before": "(32, 64)", "now": "(38, 64)"}},
                                           "cause": "uploads changed shape"}]}],
      "torch_compile": {"mode": "full", "torch_version": "2.9.0", "compilations": 3, "recompilations": 1,
                        "graph_breaks": 1, "recompile_limit_hits": 0, "compile_seconds": 1.5,
                        "functions": [{"location": "train.py:12", "function": "step", "compilations": 2,
                                       "recompilations": {"size_mismatch": 1}, "recompile_limit_hits": 0,
                                       "compile_seconds": 1.2, "failed_guards": [
                                           {"reason": "size_mismatch", "compile_id": "0/1",
                                            "guard": "tensor 'x' size mismatch at index 0. expected 4, actual 5"}]}],
                        "graph_break_sites": [{"location": "train.py:20", "reason": "print", "count": 1,
                                               "message": "Failed to trace builtin operator ...",
                                               "frames": ["step (train.py:20)"],
                                               "compiling": "step (train.py:12, compile id 0/0)"}]}}]}

``loads`` checks every field of a document read from elsewhere (a rank's file, an endpoint) against the schema
below, with bounds: counts finite and at least 0, strings and lists of bounded length. ``fit`` keeps a writer's
document within them and under ``MAX_BYTES`` (a rank whose document was cut says so in ``trimmed``).

``time_phases`` is where the rank's training thread spent its time, in seconds by phase (``step`` is goodput; see
``neuron_exporter.training.time_phases``). ``torch_compile`` (``neuron_exporter.training.torch_compile``) is
torch.compile's account: the compiled functions
by their first line, with the guards whose failure recompiled them, and the graph breaks by the user line that
broke the graph.

The node endpoint merges the documents of every rank (``merge``).
"""

from __future__ import annotations

import json

FORMAT = 1
MAX_BYTES = 1024 * 1024  # a rank's document on disk; more is not a rank's
MAX_PAGE_BYTES = 8 * 1024 * 1024  # a node endpoint's /diagnosis?format=json: it holds no more, diagnose reads no more
RECOMPILATION_WEIGHT = 10  # in the ranking (advice.py) and when sites are cut, a compilation weighs this many cuts
# Bounds of a document, checked field by field by ``loads`` and kept by ``fit``, the writer's side.
MAX_COUNT = 2.0**63  # a count or a number of seconds: finite, at least 0 and at most this
MAX_TEXT = 4096  # characters of a string (a path, a message, a shape)
MAX_ITEMS = 10_000  # entries of a list or a mapping
MAX_FRAMES = 32  # of a site


class DiagnosisError(ValueError):
    """A document that is not a diagnosis of this format; ``str()`` says what is wrong in one line."""


# The schema: "count", "text" ("text?" may be null), a dict of field -> schema (a field whose name ends with "!" is
# required; others are optional, and fields not named are left out), [schema] a list, {"*": schema} a mapping of
# text keys. Only what is named here reaches the pages, so what they print is bounded and strict JSON.
FRAMES = ["text"]
_SITE = {
    "location!": "text",
    "host_reads": {"*": "count"},
    "graph_cuts": {"*": "count"},
    "device_waits": {"*": "count"},  # host reads of an eager device (TorchNeuron's neuron), each waiting for it
    "new_graphs": "count",
    "recompilations": "count",
    "frames": FRAMES,
    "recompilation_causes": [{"uploads": {"*": {"before": "text?", "now": "text?"}}, "cause": "text"}],
}
_FALLBACK_SITE = {"op!": "text", "location!": "text", "pass": "text", "frames": FRAMES}
_FUNCTION = {
    "location!": "text",
    "function": "text",
    "compilations": "count",
    "recompilations": {"*": "count"},
    "recompile_limit_hits": "count",
    "compile_seconds": "count",
    "failed_guards": [{"reason": "text", "compile_id": "text", "guard": "text"}],
}
_BREAK_SITE = {
    "location!": "text",
    "reason": "text",
    "count": "count",
    "message": "text",
    "frames": FRAMES,
    "compiling": "text",
}
_TORCH_COMPILE = {
    "mode": "text",
    "torch_version": "text",
    "compilations": "count",
    "recompilations": "count",
    "graph_breaks": "count",
    "recompile_limit_hits": "count",
    "compile_seconds": "count",
    "functions": [_FUNCTION],
    "graph_break_sites": [_BREAK_SITE],
    "records_missed": "count",
}
_RANK = {
    "run_id": "text",
    "rank": "text",
    "local_rank": "text",
    "pid": "count",
    "steps": "count",
    "graph_cuts": "count",
    "new_graphs": "count",
    "recompilations": "count",
    "cpu_fallback_ops": {"*": "count"},
    "cpu_fallback_sites": [_FALLBACK_SITE],
    "sites": [_SITE],
    "torch_compile": _TORCH_COMPILE,
    "time_phases": {"*": "count"},  # seconds of the training thread by phase (training_time_seconds_total)
    "restarts": "count",  # processes of the rank in the run that ended without finishing (training_restarts_total)
    "lost_seconds": "count",  # step seconds done again after restarts (training_lost_seconds_total)
    # the process's work since it started: samples, tokens, FLOPs, over its seconds, and its devices' peak FLOP/s
    "throughput": {"samples": "count", "tokens": "count", "flops": "count", "seconds": "count", "peak_flops": "count"},
    "trimmed": "text",
}
_DOCUMENT = {"format!": "count", "ranks!": [_RANK]}


class _Invalid(Exception):
    """A field of the wrong type or out of bounds; ``path`` is filled in on the way out, innermost first."""

    def __init__(self, message: str):
        super().__init__(message)
        self.path: list[str] = []

    def where(self) -> str:
        return "".join(reversed(self.path)).lstrip(".") or "the document"


def _checked(value, schema, clip: bool):
    """``value`` as ``schema`` reads it (a copy); ``_Invalid`` for the first field of the wrong type or out of
    bounds. With ``clip`` (the writer), strings and lists longer than the bounds are cut and characters that are
    not printable replaced, instead."""
    if schema in ("text", "text?"):
        return None if value is None and schema == "text?" else _text(value, clip)
    if schema == "count":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= MAX_COUNT:
            shown = repr(value)[:40] if isinstance(value, (int, float)) else f"a {type(value).__name__}"
            raise _Invalid(f"not a finite number from 0 to 2^63: {shown}")
        return value
    if isinstance(schema, list):
        if not isinstance(value, list):
            raise _Invalid("not a list")
        bound = MAX_FRAMES if schema is FRAMES else MAX_ITEMS
        if len(value) > bound and not clip:
            raise _Invalid(f"more than {bound} entries")
        items = []
        for n, item in enumerate(value[:bound]):
            try:
                items.append(_checked(item, schema[0], clip))
            except _Invalid as error:
                error.path.append(f"[{n}]")
                raise
        return items
    if not isinstance(value, dict):
        raise _Invalid("not an object")
    if "*" in schema:
        if len(value) > MAX_ITEMS and not clip:
            raise _Invalid(f"more than {MAX_ITEMS} entries")
        mapping = {}
        for key, item in list(value.items())[:MAX_ITEMS]:
            try:
                mapping[_text(key, clip)] = _checked(item, schema["*"], clip)
            except _Invalid as error:
                error.path.append(f"[{key[:60]!r}]")
                raise
        return mapping
    result = {}
    for field, part in schema.items():
        name = field.rstrip("!")
        if name in value:
            try:
                result[name] = _checked(value[name], part, clip)
            except _Invalid as error:
                error.path.append(f".{name}")
                raise
        elif field.endswith("!"):
            raise _Invalid(f"no {name}")
    return result


def _text(value, clip: bool) -> str:
    if not isinstance(value, str):
        raise _Invalid("not a string")
    # Printed to terminals and encoded as UTF-8: no escape sequences, no lone surrogates.
    printable = value.isprintable() or all(c.isprintable() or c in "\n\t" for c in value)
    if clip:
        if not printable:
            value = "".join(c if c.isprintable() or c in "\n\t" else "?" for c in value)
        return value if len(value) <= MAX_TEXT else value[: MAX_TEXT - 3] + "..."
    if len(value) > MAX_TEXT:
        raise _Invalid(f"a string of more than {MAX_TEXT} characters")
    if not printable:  # lone surrogates are not printable either
        raise _Invalid("a string with a character that is not printable")
    return value


def merge(documents: list[dict]) -> dict:
    ranks = [rank for document in documents for rank in document.get("ranks", [])]
    return {"format": FORMAT, "ranks": sorted(ranks, key=lambda r: rank_order(str(r.get("rank"))))}


def rank_order(rank: str):
    """The order of ranks: numbers by value, before any other label in text order."""
    return (0, int(rank), "") if rank.isascii() and rank.isdigit() else (1, 0, rank)  # '²'.isdigit() too


def loads(data: bytes, where: str, max_bytes: int = MAX_BYTES) -> dict:
    """A document from JSON, checked field by field (types and bounds); ``DiagnosisError`` naming ``where`` and
    the field otherwise. Fields this module does not know are left out."""
    if len(data) > max_bytes:
        raise DiagnosisError(f"{where}: more than {max_bytes} bytes")
    try:
        document = json.loads(data)
    except (ValueError, RecursionError) as error:
        raise DiagnosisError(f"{where}: not JSON: {str(error)[:100]}") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise DiagnosisError(f"{where}: not a diagnosis of format {FORMAT}")
    try:
        return _checked(document, _DOCUMENT, clip=False)
    except _Invalid as error:
        raise DiagnosisError(f"{where}: {error.where()}: {error}") from None


def fit(document: dict, max_bytes: int = MAX_BYTES) -> dict:
    """The writer's side of ``loads``: ``document`` (of this process's own ranks) with strings and lists cut to the
    bounds, and, if its JSON is longer than ``max_bytes``, the frames of each site cut to one, then the least
    costly sites left out, until it fits; a rank that was cut says so in ``trimmed``."""
    try:
        document = _checked(document, _DOCUMENT, clip=True)
    except _Invalid as error:  # a count the writer got wrong
        raise DiagnosisError(f"this process's diagnosis: {error.where()}: {error}") from None
    if _size(document) <= max_bytes:
        return document
    ranks = document["ranks"]
    for rank in ranks:
        for entries in _site_lists(rank):
            for entry in entries:
                del entry.get("frames", [])[1:]
        rank["trimmed"] = f"frames cut to one per site to keep the document under {max_bytes} bytes"
    size = _size(document)
    if size <= max_bytes:
        return document
    # Leave out sites, the least costly first, until the rest fits (the note added below takes a little room).
    entries = [
        (_cost(entry, rank), id(entry), len(json.dumps(entry)) + 2)
        for rank in ranks
        for entries in _site_lists(rank)
        for entry in entries
    ]
    dropped: set[int] = set()
    excess = size + 200 * len(ranks) - max_bytes
    for _, key, length in sorted(entries, key=lambda item: item[0]):
        if excess <= 0:
            break
        dropped.add(key)
        excess -= length
    for rank in ranks:
        lists = _site_lists(rank)
        total = sum(len(entries) for entries in lists)
        for entries in lists:
            entries[:] = [entry for entry in entries if id(entry) not in dropped]
        left_out = total - sum(len(entries) for entries in lists)
        if left_out:
            rank["trimmed"] = (
                f"frames cut to one per site and {left_out} of {total} sites left out (the least "
                f"costly) to keep the document under {max_bytes} bytes"
            )
    if _size(document) > max_bytes:  # the counts by operator or cause alone are too long: only totals are left
        document["ranks"] = [
            {
                **{key: value for key, value in rank.items() if not isinstance(value, (dict, list))},
                "trimmed": f"only totals kept to keep the document under {max_bytes} bytes",
            }
            for rank in ranks
        ]
    return document


def _size(document: dict) -> int:
    return len(json.dumps(document).encode())  # as the spool writes it, the longest of the writers' forms


def _site_lists(rank: dict) -> list[list]:
    """The lists of sites of a rank: graph cuts and recompilations, CPU-fallback calls, torch.compile's."""
    part = rank.get("torch_compile", {})
    return [
        rank.get("sites", []),
        rank.get("cpu_fallback_sites", []),
        part.get("functions", []),
        part.get("graph_break_sites", []),
    ]


def _cost(entry: dict, rank: dict) -> float:
    if "op" in entry:  # a CPU-fallback call: as costly as the operator's calls
        return rank.get("cpu_fallback_ops", {}).get(entry["op"], 0)
    cuts = (
        sum(entry.get("graph_cuts", {}).values()) + sum(entry.get("device_waits", {}).values()) + entry.get("count", 0)
    )
    recompilations = entry.get("recompilations", 0)
    if isinstance(recompilations, dict):
        recompilations = sum(recompilations.values())
    return cuts + RECOMPILATION_WEIGHT * (recompilations + entry.get("recompile_limit_hits", 0))


def dumps(document: dict, indent: int | None = 1) -> str:
    """Strict JSON: a number that is not finite raises ``ValueError`` rather than becoming ``NaN``."""
    return json.dumps(document, indent=indent, allow_nan=False)
