"""The diagnosis: the detail that labels cannot carry, per rank and site, as JSON and as a ranked list of what to fix.

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

``torch_compile`` (``neuron_exporter.training.torch_compile``) is torch.compile's account: the compiled functions
by their first line, with the guards whose failure recompiled them, and the graph breaks by the user line that
broke the graph.

The node endpoint merges the documents of every rank. Used by the training process (to serve its own), the node
endpoint and ``neuron-exporter diagnose``: it imports nothing else of the package.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Callable

FORMAT = 1
MAX_BYTES = 1024 * 1024  # a rank's document on disk; more is not a rank's
MAX_PAGE_BYTES = 8 * 1024 * 1024  # a node endpoint's /diagnosis?format=json: it holds no more, diagnose reads no more
WIDTH = 100
RECOMPILATION_WEIGHT = 10  # in the ranking, a compilation costs as much as this many graph cuts
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
    cuts = sum(entry.get("graph_cuts", {}).values()) + entry.get("count", 0)
    recompilations = entry.get("recompilations", 0)
    if isinstance(recompilations, dict):
        recompilations = sum(recompilations.values())
    return cuts + RECOMPILATION_WEIGHT * (recompilations + entry.get("recompile_limit_hits", 0))


def dumps(document: dict, indent: int | None = 1) -> str:
    """Strict JSON: a number that is not finite raises ``ValueError`` rather than becoming ``NaN``."""
    return json.dumps(document, indent=indent, allow_nan=False)


def _number(value) -> float:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else 0


def _frames(entry: dict, limit: int) -> list[str]:
    """The first ``limit`` frames of a site's ``frames`` list (none if it is not a list of strings)."""
    frames = entry.get("frames")
    return [f for f in frames if isinstance(f, str)][:limit] if isinstance(frames, list) else []


def _counts(mapping) -> dict[str, float]:
    if not isinstance(mapping, dict):
        return {}
    return {str(key): _number(value) for key, value in mapping.items()}


def findings(document: dict) -> list[tuple[float | None, str, list[str]]]:
    """(count per step of a rank where it happens, title, detail lines) of every problem in the document, what costs
    the most first (the count per step times the ranks; a recompilation weighs ten graph cuts). torch.compile's
    graph breaks and recompile-limit hits happen once, at compile time, and cost every step after it: they have
    no count per step (None), and weigh as one graph cut and one recompilation per step."""
    problems: dict[tuple[str, str], dict] = {}

    def problem(kind: str, location: str) -> dict:
        return problems.setdefault((kind, location), {"steps": 0, "ranks": set(), "detail": None, "count": 0})

    for rank in document.get("ranks", []):
        steps = max(1, _number(rank.get("steps")))
        name = str(rank.get("rank"))
        for site in rank.get("sites", []):
            location = site["location"]
            frames = _frames(site, 5)
            for cause, count in _counts(site.get("graph_cuts")).items():
                entry = problem(f"cut:{cause}", location)
                entry["steps"] += steps
                entry["count"] += count
                entry["ranks"].add(name)
                entry["detail"] = entry["detail"] or frames
            recompilations = _number(site.get("recompilations"))
            if recompilations:
                entry = problem("recompile", location)
                entry["steps"] += steps
                entry["count"] += recompilations
                entry["ranks"].add(name)
                changes = [c for c in site.get("recompilation_causes", []) if isinstance(c, dict)]
                entry["detail"] = entry["detail"] or frames + _changes(changes[-1:] if changes else [])
        called = _fallback_calls(rank.get("cpu_fallback_sites"))
        for op, count in _counts(rank.get("cpu_fallback_ops")).items():
            entry = problem("fallback", op)
            entry["steps"] += steps
            entry["count"] += count
            entry["ranks"].add(name)
            entry["detail"] = entry["detail"] or called.get(op)
        _compile_problems(rank.get("torch_compile"), _number(rank.get("steps")), name, problem)
    result = []
    for (kind, where), entry in problems.items():
        if kind.startswith("compile_"):
            result.append(_compile_finding(kind, where, entry))
            continue
        names = sorted(entry["ranks"], key=rank_order)
        ranks = f"rank{'s' if len(names) != 1 else ''} {', '.join(names[:8])}{', ...' if len(names) > 8 else ''}"
        count = int(entry["count"])
        if kind == "recompile":
            title = f"{where}: {count} recompilations ({ranks})"
            advice = [
                "The same graph compiled again with other shapes or Python values: pad or bucket the inputs "
                "named below to a few fixed shapes, or mark the dimension dynamic."
            ]
        elif kind == "fallback":
            title = f"{where}: runs on the CPU, {count} calls ({ranks})"
            advice = [
                "No XLA lowering: every call cuts the graph and copies tensors to the host and back. Replace "
                "the operator, or ask for a lowering (aten:: ops: torch_xla; others: register an XLA "
                "implementation with torch.library)."
            ]
            if not entry["detail"]:
                advice.append(
                    "To name the line that calls it, run with NEURON_EXPORTER_FALLBACK_SITES=1 (one step "
                    "is watched when an operator first falls back)."
                )
        else:
            cause = kind.split(":", 1)[1]
            title = f"{where}: {count} graph cuts by {_cause_text(cause)} ({ranks})"
            advice = [_cut_advice(cause)]
        rate = entry["count"] / entry["steps"]  # per step of a rank where it happens
        weight = rate * len(names) * (RECOMPILATION_WEIGHT if kind == "recompile" else 1)
        result.append((weight, rate, title, advice + (entry["detail"] or [])))
    return [item[1:] for item in sorted(result, key=lambda item: -item[0])]


def _fallback_calls(sites) -> dict[str, list[str]]:
    """Operator -> the lines that say where the fallback probe saw it called."""
    calls: dict[str, list[str]] = {}
    for site in sites if isinstance(sites, list) else []:
        if not isinstance(site, dict) or not all(isinstance(site.get(key), str) for key in ("op", "location")):
            continue
        where = (
            f"called from the backward pass of {site['location']}"
            if site.get("pass") == "backward"
            else f"called at {site['location']}"
        )
        frames = _frames(site, 5)
        calls.setdefault(site["op"], []).extend([where] + [f"  {frame}" for frame in frames])
    return calls


def _compile_problems(part, steps: float, rank: str, problem: Callable[[str, str], dict]) -> None:
    """Gather one rank's torch.compile findings: recompilations and limit hits by function, graph breaks by line."""
    if not isinstance(part, dict):
        return
    for function in part.get("functions", []):
        if not isinstance(function, dict) or not isinstance(function.get("location"), str):
            continue
        guards = [g for g in function.get("failed_guards", []) if isinstance(g, dict)]
        for kind, count in (
            ("compile_recompile", sum(_counts(function.get("recompilations")).values())),
            ("compile_limit", _number(function.get("recompile_limit_hits"))),
        ):
            if not count:
                continue
            entry = problem(kind, function["location"])
            entry["steps"] += steps  # training steps seen: none in a process that only compiles
            entry["count"] += count
            entry["ranks"].add(rank)
            entry["function"] = str(function.get("function") or "")
            for kind_name, kind_count in _counts(function.get("recompilations")).items():
                entry.setdefault("reasons", {})
                entry["reasons"][kind_name] = entry["reasons"].get(kind_name, 0) + kind_count
            entry["guards"] = entry.get("guards") or [g for g in guards if isinstance(g.get("guard"), str)][-3:]
    for site in part.get("graph_break_sites", []):
        if not isinstance(site, dict) or not isinstance(site.get("location"), str):
            continue
        entry = problem("compile_break", f"{site['location']}\t{site.get('reason', 'other')}")
        entry["steps"] += steps
        entry["count"] += _number(site.get("count"))
        entry["ranks"].add(rank)
        if entry["detail"] is None:
            message = str(site.get("message") or "").splitlines()
            frames = _frames(site, 4)
            compiling = (
                [f"while compiling {site['compiling']}"]
                if isinstance(site.get("compiling"), str) and site.get("compiling")
                else []
            )
            entry["detail"] = [line.strip() for line in message[:2] if line.strip()] + frames + compiling


COMPILE_RECOMPILE_ADVICE = {
    "size_mismatch": "A tensor's shape changed: mark the dimension dynamic (torch._dynamo.mark_dynamic(x, 0) before "
    "the call, or torch.compile(..., dynamic=True)), or pad or bucket the inputs to a few fixed "
    "shapes (drop_last=True for the last batch).",
    "value_changed": "A Python value the graph was specialized on changed (an int or float argument, a global, a "
    "step counter): pass it as a tensor, or keep it constant.",
    "dtype_mismatch": "A tensor came with another dtype: cast the inputs to one dtype before the call.",
    "device_mismatch": "A tensor came on another device: move the inputs to one device before the call.",
    "requires_grad_mismatch": "requires_grad of an input changed between calls: keep it the same, or compile the "
    "training and evaluation steps as separate functions.",
    "global_state": "Global state changed between calls (grad mode, autocast): compile the training and evaluation "
    "steps as separate functions.",
}
COMPILE_RECOMPILE_DEFAULT = (
    "A guard of the compiled code failed (shown below): make what it checks the same at every call, or mark it dynamic."
)


def _compile_finding(kind: str, where: str, entry: dict) -> tuple[float, float | None, str, list[str]]:
    names = sorted(entry["ranks"], key=rank_order)
    ranks = f"rank{'s' if len(names) != 1 else ''} {', '.join(names[:8])}{', ...' if len(names) > 8 else ''}"
    count = int(entry["count"])
    function = f"{entry.get('function')}()" if entry.get("function") else "the function"
    guards = [f"failed guard ({g.get('reason', 'other')}): {g['guard']}" for g in entry.get("guards", [])]
    if kind == "compile_break":
        location, reason = where.split("\t", 1)
        title = (
            f"{location}: {count} torch.compile graph break{'s' if count != 1 else ''} "
            f"({_break_text(reason)}) ({ranks})"
        )
        advice = [_break_advice(reason)]
        return len(names), None, title, advice + (entry["detail"] or [])
    if kind == "compile_limit":
        title = (
            f"{where}: {function} hit torch.compile's recompile limit and runs without compiling from then on ({ranks})"
        )
        advice = [
            "It recompiled torch._dynamo.config.recompile_limit times (8 by default). Remove the cause of the "
            "recompilations below rather than raising the limit."
        ]
        return len(names) * RECOMPILATION_WEIGHT, None, title, advice + guards[-2:]
    reasons = entry.get("reasons", {})
    top = max(reasons, key=reasons.get) if reasons else "other"
    shown = ", ".join(f"{name} {int(n)}" for name, n in sorted(reasons.items(), key=lambda item: -item[1]))
    title = f"{where}: {count} torch.compile recompilation{'s' if count != 1 else ''} of {function}: {shown} ({ranks})"
    rate = entry["count"] / entry["steps"] if entry["steps"] else None
    weight = (rate if rate is not None else entry["count"]) * len(names) * RECOMPILATION_WEIGHT
    advice = [COMPILE_RECOMPILE_ADVICE.get(top, COMPILE_RECOMPILE_DEFAULT)]
    return weight, rate, title, advice + guards


def _break_text(reason: str) -> str:
    return {
        "print": "print or logging",
        "data_dependent_branch": "an if or while on a tensor's value",
        "tensor_value": "a tensor's value read in Python (.item(), .tolist(), a data-dependent shape)",
        "explicit": "torch._dynamo.graph_break()",
        "disabled_function": "a function torch.compile skips",
        "autograd": "autograd inside the compiled function",
        "context_manager": "a context manager",
        "store_attr": "an attribute assignment",
        "unsupported_builtin": "an unsupported builtin",
        "unsupported_call": "an unsupported call",
    }.get(reason, reason)


def _break_advice(reason: str) -> str:
    common = " Check with torch.compile(..., fullgraph=True), which raises at the first graph break."
    return {
        "print": "Move the print or log call out of the compiled function, or log every N steps outside it.",
        "data_dependent_branch": "Python control flow on a tensor's value: use torch.where, or torch.cond for "
        "branches; keep the decision out of the compiled function.",
        "tensor_value": "A tensor's value is needed in Python: keep it on the device, or set "
        "torch._dynamo.config.capture_scalar_outputs = True for .item().",
        "autograd": "Call loss.backward() outside the compiled function (compile the model or the loss only).",
    }.get(
        reason,
        "Dynamo could not trace this line: rewrite it with torch operations or move it out of the compiled function.",
    ) + common


def _changes(changes: list[dict]) -> list[str]:
    lines = []
    for change in changes:
        uploads = change.get("uploads")
        if not isinstance(uploads, dict):
            uploads = {}
        for upload, shapes in list(uploads.items())[:4]:
            if isinstance(shapes, dict):
                lines.append(f"upload at {upload}: {shapes.get('before')} -> {shapes.get('now')}")
        if not uploads and isinstance(change.get("cause"), str):
            lines.append(change["cause"])
    return lines


def _cause_text(cause: str) -> str:
    return {
        "item": ".item()",
        "bool": "a tensor used as a Python bool (if t:)",
        "int": "int(t)",
        "float": "float(t)",
        "index": "a tensor used as an index",
        "tolist": ".tolist()",
        "numpy": ".numpy()",
        "cpu": ".cpu() or .to('cpu')",
        "print": "printing or formatting a tensor",
        "cpu_fallback": "operators that run on the CPU",
        "unattributed": "an unseen host read",
        "sync_tensors": "a sync of chosen tensors (xm.mesh_reduce, xm.save)",
    }.get(cause, cause)


def _cut_advice(cause: str) -> str:
    if cause == "cpu_fallback":
        return "An operator with no XLA lowering ran before the step's end; see the CPU-fallback operators."
    if cause == "sync_tensors":
        return (
            "torch_xla ran the graph of the tensors it was given before the step's end (to reduce them across "
            "processes or save them): do it after the step marker, or less often."
        )
    if cause == "unattributed":
        return (
            "A graph ran before the step's end, but no Python host read was seen (torch.equal, allclose, "
            "nonzero, boolean-mask indexing, or work on another thread)."
        )
    return (
        "The host needed a value before the step ended, so the graph ran early and the device waited. Move the "
        "read after the step marker, keep the value on the device (torch.where instead of if), or read it only "
        "every N steps (xm.add_step_closure)."
    )


def page(make_document: Callable[[], dict]) -> Callable[[dict], tuple[bytes, str]]:
    """The ``/diagnosis`` page of an endpoint: JSON with ``?format=json``, the ranked list otherwise."""

    def render(query: dict[str, list[str]]) -> tuple[bytes, str]:
        document = make_document()
        if query.get("format") == ["json"]:
            return dumps(document).encode() + b"\n", "application/json"
        return render_text(document).encode(), "text/plain; charset=utf-8"

    return render


def render_text(document: dict) -> str:
    ranks = document.get("ranks", [])
    lines = [f"Diagnosis of {len(ranks)} rank{'s' if len(ranks) != 1 else ''}: what to fix first."]
    compiled = _compile_summary(ranks)
    if compiled:
        lines.append(compiled)
    lines.extend(
        f"Rank {rank.get('rank')}: {rank['trimmed']}."
        for rank in ranks
        if isinstance(rank, dict) and isinstance(rank.get("trimmed"), str)
    )
    problems = findings(document)
    if not problems:
        lines.append("No graph cuts, recompilations, graph breaks or CPU-fallback operators seen.")
    for number, (rate, title, detail) in enumerate(problems, start=1):
        lines.append("")
        lines.append(f"{number}. {title}" + (f": {rate:.2f} per step" if rate is not None else ""))
        for line in detail:
            lines.extend(textwrap.wrap(line, WIDTH, initial_indent="   ", subsequent_indent="     ") or ["   "])
    return "\n".join(lines) + "\n"


def _compile_summary(ranks: list) -> str | None:
    """One line of torch.compile totals over the ranks that compiled anything; None if none did."""
    parts: list = [rank.get("torch_compile") for rank in ranks if isinstance(rank, dict)]
    parts = [
        p for p in parts if isinstance(p, dict) and (_number(p.get("compilations")) or _number(p.get("graph_breaks")))
    ]
    if not parts:
        return None
    total = {
        key: sum(_number(p.get(key)) for p in parts)
        for key in ("compilations", "recompilations", "graph_breaks", "recompile_limit_hits", "compile_seconds")
    }
    counting = " (counted without lines on this torch)" if any(p.get("mode") == "counting" for p in parts) else ""
    return (
        f"torch.compile on {len(parts)} rank{'s' if len(parts) != 1 else ''}: {int(total['compilations'])} "
        f"compilations, {int(total['recompilations'])} recompilations, {int(total['graph_breaks'])} graph "
        f"breaks, {int(total['recompile_limit_hits'])} functions at the recompile limit, "
        f"{total['compile_seconds']:.1f} s compiling{counting}."
    )
