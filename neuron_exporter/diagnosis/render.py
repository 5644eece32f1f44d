"""The diagnosis as people read it: the ranked list of what to fix, and the ``/diagnosis`` page of an endpoint."""

from __future__ import annotations

import textwrap
from collections.abc import Callable

from ..label_values import GOODPUT_PHASE  # the productive phase of ``time_phases``; every other is badput
from .advice import as_number, findings
from .document import dumps

WIDTH = 100


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
    lines.extend(goodput_lines(ranks))
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


TOP_BADPUT = 3


def goodput_lines(ranks: list) -> list[str]:
    """One line per run whose ranks say where their time went: its goodput (the training steps' share of its ranks'
    time) and its largest badput phases, e.g. ``Run 42, 8 ranks: goodput 0.41 | compile 33% host_sync 18% data
    6%``."""
    runs: dict[str, list[dict]] = {}
    for rank in ranks:
        if isinstance(rank, dict) and isinstance(rank.get("time_phases"), dict):
            runs.setdefault(str(rank.get("run_id", "")), []).append(rank["time_phases"])
    lines = []
    for run_id, phases in sorted(runs.items()):
        totals: dict[str, float] = {}
        for seconds in phases:
            for phase, value in seconds.items():
                totals[phase] = totals.get(phase, 0.0) + as_number(value)
        whole = sum(totals.values())
        if whole <= 0:
            continue
        badput = sorted((-value, phase) for phase, value in totals.items() if phase != GOODPUT_PHASE and value > 0)
        shares = " ".join(f"{phase} {-value / whole:.0%}" for value, phase in badput[:TOP_BADPUT])
        name = f"Run {run_id}" if run_id else "Run"
        lines.append(
            f"{name}, {len(phases)} rank{'s' if len(phases) != 1 else ''}: goodput "
            f"{totals.get(GOODPUT_PHASE, 0.0) / whole:.2f}" + (f" | {shares}" if shares else "")
        )
    return lines


def _compile_summary(ranks: list) -> str | None:
    """One line of torch.compile totals over the ranks that compiled anything; None if none did."""
    parts: list = [rank.get("torch_compile") for rank in ranks if isinstance(rank, dict)]
    parts = [
        p
        for p in parts
        if isinstance(p, dict) and (as_number(p.get("compilations")) or as_number(p.get("graph_breaks")))
    ]
    if not parts:
        return None
    total = {
        key: sum(as_number(p.get(key)) for p in parts)
        for key in ("compilations", "recompilations", "graph_breaks", "recompile_limit_hits", "compile_seconds")
    }
    counting = " (counted without lines on this torch)" if any(p.get("mode") == "counting" for p in parts) else ""
    return (
        f"torch.compile on {len(parts)} rank{'s' if len(parts) != 1 else ''}: {int(total['compilations'])} "
        f"compilations, {int(total['recompilations'])} recompilations, {int(total['graph_breaks'])} graph "
        f"breaks, {int(total['recompile_limit_hits'])} functions at the recompile limit, "
        f"{total['compile_seconds']:.1f} s compiling{counting}."
    )
