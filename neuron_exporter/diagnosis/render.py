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


STRAGGLER_PHASES = ("data", "compile", "host_sync", "checkpoint")  # a rank's own badput, which the others wait for
STRAGGLER_MIN_RANKS = 4
STRAGGLER_EXCESS_SHARE = 0.1  # of the run's time per step, as TrainingStraggler judges (mixin's thresholds)


def goodput_lines(ranks: list) -> list[str]:
    """One line per run whose ranks say where their time went: its goodput over its life (the training steps' share
    of its ranks' time, less the work done again after restarts) and its largest badput phases, its restarts, and
    the rank that holds it back, e.g. ``Run 42, 8 ranks: goodput 0.41 | compile 33% host_sync 18% data 6%``."""
    runs: dict[str, list[dict]] = {}
    for rank in ranks:
        if isinstance(rank, dict) and isinstance(rank.get("time_phases"), dict):
            runs.setdefault(str(rank.get("run_id", "")), []).append(rank)
    lines = []
    for run_id, members in sorted(runs.items()):
        totals: dict[str, float] = {}
        for member in members:
            for phase, value in member["time_phases"].items():
                totals[phase] = totals.get(phase, 0.0) + as_number(value)
        whole = sum(totals.values())
        if whole <= 0:
            continue
        lost = sum(as_number(member.get("lost_seconds")) for member in members)
        badput = sorted((-value, phase) for phase, value in totals.items() if phase != GOODPUT_PHASE and value > 0)
        shares = " ".join(f"{phase} {-value / whole:.0%}" for value, phase in badput[:TOP_BADPUT])
        if lost > 0:
            shares += f" lost work {lost / whole:.0%}"
        name = f"Run {run_id}" if run_id else "Run"
        lines.append(
            f"{name}, {len(members)} rank{'s' if len(members) != 1 else ''}: goodput "
            f"{max(0.0, totals.get(GOODPUT_PHASE, 0.0) - lost) / whole:.2f}"
            + (f" | {shares.strip()}" if shares else "")
        )
        throughput = _throughput(members)
        if throughput:
            lines.append(f"{name} since its processes started: {throughput}")
        restarted = [member for member in members if as_number(member.get("restarts")) > 0]
        if restarted:
            restarts = max(int(as_number(member.get("restarts"))) for member in restarted)
            lines.append(
                f"{name} restarted: {restarts} time{'s' if restarts != 1 else ''} (ranks {_ranks(restarted)}); "
                f"{totals.get('recovery', 0.0):.1f} s of its ranks' time between processes, and {lost:.1f} s of "
                "steps done again since the checkpoints they resumed from. Save checkpoints more often to lose less; "
                "see why the processes ended in their last log lines."
            )
        straggler = _straggler(members)
        if straggler:
            lines.append(f"{name} is held back by {straggler}.")
    return lines


def _throughput(members: list[dict]) -> str | None:
    """The run's samples, tokens and FLOPs per second (each rank's over its process's life, summed), and its MFU where
    every rank that counted FLOPs knows its peak; None if no rank counted any work."""
    rates = {"samples": 0.0, "tokens": 0.0, "flops": 0.0}
    peak, peaks_known = 0.0, True
    for member in members:
        work = member.get("throughput")
        if not isinstance(work, dict) or as_number(work.get("seconds")) <= 0:
            continue
        for key in rates:
            rates[key] += as_number(work.get(key)) / as_number(work["seconds"])
        if as_number(work.get("flops")) > 0:
            peak += as_number(work.get("peak_flops"))
            peaks_known = peaks_known and as_number(work.get("peak_flops")) > 0
    if not any(rates.values()):
        return None
    parts = [f"{rates['samples']:,.1f} samples/s"]
    if rates["tokens"]:
        parts.append(f"{rates['tokens']:,.0f} tokens/s")
    if rates["flops"]:
        parts.append(_flop_rate(rates["flops"]))
        if peak and peaks_known:
            share = rates["flops"] / peak
            wrong = f"MFU over 100%: the peak ({_flop_rate(peak)}) is wrong, set peak_flops"
            parts.append(f"MFU {share:.1%}" if share <= 1 else wrong)
    return ", ".join(parts) + "."


def _flop_rate(flops: float) -> str:
    for scale, unit in ((1e15, "PFLOP/s"), (1e12, "TFLOP/s"), (1e9, "GFLOP/s"), (1e6, "MFLOP/s")):
        if flops >= scale:
            return f"{flops / scale:,.3g} {unit}"
    return f"{flops:,.0f} FLOP/s"


def _ranks(members: list[dict]) -> str:
    ranks = sorted(str(member.get("rank")) for member in members)
    return ", ".join(ranks[:8]) + (f" and {len(ranks) - 8} more" if len(ranks) > 8 else "")


def _straggler(members: list[dict]) -> str | None:
    """The rank whose own badput per step (``STRAGGLER_PHASES``) exceeds the run's median rank's most, by at least
    ``STRAGGLER_EXCESS_SHARE`` of the median rank's time per step, over the ranks' lives: the others wait for it."""
    stepping = [member for member in members if as_number(member.get("steps")) > 0]
    if len(stepping) < STRAGGLER_MIN_RANKS:
        return None
    per_step = sorted(sum(as_number(v) for v in m["time_phases"].values()) / as_number(m["steps"]) for m in stepping)
    run_step = per_step[len(per_step) // 2]
    worst: tuple[float, str, str] | None = None
    for phase in STRAGGLER_PHASES:
        own = [as_number(m["time_phases"].get(phase)) / as_number(m["steps"]) for m in stepping]
        median = sorted(own)[len(own) // 2]
        for member, seconds in zip(stepping, own, strict=True):
            excess = (seconds - median) / run_step if run_step > 0 else 0.0
            if excess >= STRAGGLER_EXCESS_SHARE and (worst is None or excess > worst[0]):
                worst = (excess, str(member.get("rank")), phase)
    if worst is None:
        return None
    excess, rank, phase = worst
    return (
        f"rank {rank}: its {phase} takes {excess:.0%} of the run's time per step more than the median rank's, and "
        "every other rank waits for it at each collective"
    )


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
