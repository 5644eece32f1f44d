"""The advice engine: every problem of a diagnosis document, ranked by what it costs, with what to do about it."""

from __future__ import annotations

from collections.abc import Callable

from .document import RECOMPILATION_WEIGHT, rank_order


def as_number(value) -> float:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else 0


def _frames(entry: dict, limit: int) -> list[str]:
    """The first ``limit`` frames of a site's ``frames`` list (none if it is not a list of strings)."""
    frames = entry.get("frames")
    return [f for f in frames if isinstance(f, str)][:limit] if isinstance(frames, list) else []


def _counts(mapping) -> dict[str, float]:
    if not isinstance(mapping, dict):
        return {}
    return {str(key): as_number(value) for key, value in mapping.items()}


def findings(document: dict) -> list[tuple[float | None, str, list[str]]]:
    """(count per step of a rank where it happens, title, detail lines) of every problem in the document, what costs
    the most first (the count per step times the ranks; a recompilation weighs ten graph cuts). torch.compile's
    graph breaks and recompile-limit hits happen once, at compile time, and cost every step after it: they have
    no count per step (None), and weigh as one graph cut and one recompilation per step."""
    problems: dict[tuple[str, str], dict] = {}

    def problem(kind: str, location: str) -> dict:
        return problems.setdefault((kind, location), {"steps": 0, "ranks": set(), "detail": None, "count": 0})

    for rank in document.get("ranks", []):
        steps = max(1, as_number(rank.get("steps")))
        name = str(rank.get("rank"))
        for site in rank.get("sites", []):
            location = site["location"]
            frames = _frames(site, 5)
            for kind, counts in (("cut", site.get("graph_cuts")), ("wait", site.get("device_waits"))):
                for cause, count in _counts(counts).items():
                    entry = problem(f"{kind}:{cause}", location)
                    entry["steps"] += steps
                    entry["count"] += count
                    entry["ranks"].add(name)
                    entry["detail"] = entry["detail"] or frames
            recompilations = as_number(site.get("recompilations"))
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
        _compile_problems(rank.get("torch_compile"), as_number(rank.get("steps")), name, problem)
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
                "No kernel on the device (no XLA lowering, or none of TorchNeuron's): every call copies tensors "
                "to the host and back, and on XLA cuts the graph. Replace the operator, or ask for a lowering "
                "(aten:: ops: torch_xla or torch-neuronx; others: register an implementation with torch.library)."
            ]
            if not entry["detail"]:
                advice.append(
                    "To name the line that calls it, run with NEURON_EXPORTER_FALLBACK_SITES=1 (one step "
                    "is watched when an operator first falls back)."
                )
        elif kind.startswith("wait:"):
            cause = kind.split(":", 1)[1]
            title = f"{where}: {count} host reads by {_cause_text(cause)} that wait for the device ({ranks})"
            advice = [
                "The host waited for the device to finish the work queued before the read (TorchNeuron's neuron "
                "device runs eagerly). Read it only every N steps, or keep the value on the device (torch.where "
                "instead of if)."
            ]
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
            ("compile_limit", as_number(function.get("recompile_limit_hits"))),
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
        entry["count"] += as_number(site.get("count"))
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
