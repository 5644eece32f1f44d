"""The diagnosis: the detail that labels cannot carry, per rank and site, as JSON and as a ranked list of what to fix.

A rank's document (``/diagnosis?format=json`` of a rank, and ``rank-R.diagnosis.json`` in the spool)::

    {"format": 1, "ranks": [{"rank": "0", "local_rank": "0", "pid": 42, "steps": 120, "graph_cuts": 120,
      "new_graphs": 3, "recompilations": 0, "cpu_fallback_ops": {"aten::lgamma": 120},
      "sites": [{"location": "train.py:42", "host_reads": {"item": 120}, "graph_cuts": {"item": 120},
                 "new_graphs": 1, "recompilations": 0, "frames": ["step (train.py:42)", "<module> (train.py:60)"],
                 "recompilation_causes": [{"uploads": {"train.py:30": {"before": "(32, 64)", "now": "(38, 64)"}},
                                           "cause": "uploads changed shape"}]}]}]}

The node endpoint merges the documents of every rank. Used by the training process (to serve its own), the node
endpoint and ``neuron-exporter diagnose``: it imports nothing else of the package.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Callable

FORMAT = 1
MAX_BYTES = 1024 * 1024  # a rank's document on disk; more is not a rank's
WIDTH = 100
RECOMPILATION_WEIGHT = 10  # in the ranking, a compilation costs as much as this many graph cuts


class DiagnosisError(ValueError):
    """A document that is not a diagnosis of this format; ``str()`` says what is wrong in one line."""


def merge(documents: list[dict]) -> dict:
    ranks = [rank for document in documents for rank in document.get("ranks", [])]
    return {"format": FORMAT, "ranks": sorted(ranks, key=lambda r: _rank_order(str(r.get("rank"))))}


def _rank_order(rank: str):
    return (0, int(rank), "") if rank.isdigit() else (1, 0, rank)


def loads(data: bytes, where: str) -> dict:
    """A document from JSON, checked for the shape this module reads; ``DiagnosisError`` naming ``where``."""
    if len(data) > MAX_BYTES:
        raise DiagnosisError(f"{where}: more than {MAX_BYTES} bytes")
    try:
        document = json.loads(data)
    except (ValueError, RecursionError) as error:
        raise DiagnosisError(f"{where}: not JSON: {str(error)[:100]}") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT or not isinstance(
            document.get("ranks"), list):
        raise DiagnosisError(f"{where}: not a diagnosis of format {FORMAT}")
    for rank in document["ranks"]:
        if not isinstance(rank, dict) or not isinstance(rank.get("sites", []), list) or not all(
                isinstance(site, dict) and isinstance(site.get("location"), str) for site in rank.get("sites", [])):
            raise DiagnosisError(f"{where}: a rank or site of the wrong shape")
    return document


def _number(value) -> float:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else 0


def _counts(mapping) -> dict[str, float]:
    if not isinstance(mapping, dict):
        return {}
    return {str(key): _number(value) for key, value in mapping.items()}


def findings(document: dict) -> list[tuple[float, str, list[str]]]:
    """(count per step of a rank where it happens, title, detail lines) of every problem in the document, what costs
    the most first (the count per step times the ranks; a recompilation weighs ten graph cuts)."""
    problems: dict[tuple[str, str], dict] = {}

    def problem(kind: str, location: str) -> dict:
        return problems.setdefault((kind, location), {"steps": 0, "ranks": set(), "detail": None, "count": 0})

    for rank in document.get("ranks", []):
        steps = max(1, _number(rank.get("steps")))
        name = str(rank.get("rank"))
        for site in rank.get("sites", []):
            location = site["location"]
            frames = [str(f) for f in site.get("frames", []) if isinstance(f, str)][:4]
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
        for op, count in _counts(rank.get("cpu_fallback_ops")).items():
            entry = problem("fallback", op)
            entry["steps"] += steps
            entry["count"] += count
            entry["ranks"].add(name)
    result = []
    for (kind, where), entry in problems.items():
        names = sorted(entry["ranks"], key=_rank_order)
        ranks = f"rank{'s' if len(names) != 1 else ''} {', '.join(names[:8])}{', ...' if len(names) > 8 else ''}"
        count = int(entry["count"])
        if kind == "recompile":
            title = f"{where}: {count} recompilations ({ranks})"
            advice = ["The same graph compiled again with other shapes or Python values: pad or bucket the inputs "
                      "named below to a few fixed shapes, or mark the dimension dynamic."]
        elif kind == "fallback":
            title = f"{where}: runs on the CPU, {count} calls ({ranks})"
            advice = ["No XLA lowering: every call cuts the graph and copies tensors to the host and back. Replace "
                      "the operator, or ask for a lowering (aten:: ops: torch_xla; others: register an XLA "
                      "implementation with torch.library)."]
        else:
            cause = kind.split(":", 1)[1]
            title = f"{where}: {count} graph cuts by {_cause_text(cause)} ({ranks})"
            advice = [_cut_advice(cause)]
        rate = entry["count"] / entry["steps"]  # per step of a rank where it happens
        weight = rate * len(names) * (RECOMPILATION_WEIGHT if kind == "recompile" else 1)
        result.append((weight, rate, title, advice + (entry["detail"] or [])))
    return [item[1:] for item in sorted(result, key=lambda item: -item[0])]


def _changes(changes: list[dict]) -> list[str]:
    lines = []
    for change in changes:
        uploads = change.get("uploads") if isinstance(change.get("uploads"), dict) else {}
        for upload, shapes in list(uploads.items())[:4]:
            if isinstance(shapes, dict):
                lines.append(f"upload at {upload}: {shapes.get('before')} -> {shapes.get('now')}")
        if not uploads and isinstance(change.get("cause"), str):
            lines.append(change["cause"])
    return lines


def _cause_text(cause: str) -> str:
    return {"item": ".item()", "bool": "a tensor used as a Python bool (if t:)", "int": "int(t)",
            "float": "float(t)", "index": "a tensor used as an index", "tolist": ".tolist()",
            "numpy": ".numpy()", "cpu": ".cpu() or .to('cpu')", "print": "printing or formatting a tensor",
            "cpu_fallback": "operators that run on the CPU", "unattributed": "an unseen host read"}.get(cause, cause)


def _cut_advice(cause: str) -> str:
    if cause == "cpu_fallback":
        return "An operator with no XLA lowering ran before the step's end; see the CPU-fallback operators."
    if cause == "unattributed":
        return ("A graph ran before the step's end, but no Python host read was seen (torch.equal, allclose, "
                "nonzero, boolean-mask indexing, or work on another thread).")
    return ("The host needed a value before the step ended, so the graph ran early and the device waited. Move the "
            "read after the step marker, keep the value on the device (torch.where instead of if), or read it only "
            "every N steps (xm.add_step_closure).")


def page(make_document: Callable[[], dict]) -> Callable[[dict], tuple[bytes, str]]:
    """The ``/diagnosis`` page of an endpoint: JSON with ``?format=json``, the ranked list otherwise."""
    def render(query: dict[str, list[str]]) -> tuple[bytes, str]:
        document = make_document()
        if query.get("format") == ["json"]:
            return json.dumps(document, indent=1).encode() + b"\n", "application/json"
        return render_text(document).encode(), "text/plain; charset=utf-8"

    return render


def render_text(document: dict) -> str:
    ranks = document.get("ranks", [])
    lines = [f"Diagnosis of {len(ranks)} rank{'s' if len(ranks) != 1 else ''}: what to fix first."]
    problems = findings(document)
    if not problems:
        lines.append("No graph cuts, recompilations or CPU-fallback operators seen.")
    for number, (rate, title, detail) in enumerate(problems, start=1):
        lines.append("")
        lines.append(f"{number}. {title}: {rate:.2f} per step")
        for line in detail:
            lines.extend(textwrap.wrap(line, WIDTH, initial_indent="   ", subsequent_indent="     ") or ["   "])
    return "\n".join(lines) + "\n"
