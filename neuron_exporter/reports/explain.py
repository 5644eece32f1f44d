"""A plain-language diagnosis of a Snapshot: what slows the training loop down, and what to do next, as text.

It shows the figures of the report (``findings.figures``), how its steps were counted (``step_count``), then every
finding (``findings``) with what to do next.
"""

from __future__ import annotations

import textwrap

from ..snapshot import Snapshot
from .findings import HOST_READS_PER_STEP, Figures, figures, findings_of
from .step_count import SyncHistory, plural

WIDTH = 100


def explain(snapshot: Snapshot, history: SyncHistory | None = None, training_steps: int | None = None) -> str:
    """The diagnosis as text: an overview of the figures, how the steps were counted, then each finding.

    ``history``: the reports of an XLA_METRICS_FILE dump up to ``snapshot``, its last one. ``training_steps``: the
    training steps the report covers, as the user counted them; without them the figures are per step marker.
    """
    f = figures(snapshot, history, training_steps)
    lines = ["Overview", *_overview(f)]
    if f.short_report:
        lines += [
            "",
            _wrap(
                "This is a short_metrics_report(): it lists only the aten:: operators that ran on the "
                "CPU, not those of other namespaces (torchvision::, custom ops), and few other counters. "
                "Save met.metrics_report() to see them all.",
                "",
            ),
        ]
    given = (
        [f"The per-step figures are per training step: {f.training_steps}, as given with --steps."]
        if f.training_steps
        else []
    )
    lines += ["", "Steps", *[_wrap(text, "   ") for text in given + f.count.explanation], ""]
    found = findings_of(f)
    if not found:
        if f.steps:
            lines.append(
                _wrap(
                    "Nothing wrong found: no CPU fallback operator, no more than "
                    f"{HOST_READS_PER_STEP} host reads per {f.unit}, one graph per {f.unit}, and no "
                    "compilations after the first steps.",
                    "",
                )
            )
        else:
            lines.append(
                _wrap(
                    "Nothing wrong found: no CPU fallback operator and no .item() call. Without a step "
                    "count, the per-step checks (graphs, host reads, compilations) could not run.",
                    "",
                )
            )
        return "\n".join(lines) + "\n"
    lines.append(f"Findings ({len(found)})")
    for number, finding in enumerate(found, 1):
        lines += ["", f"{number}. {finding.title}"]
        lines += [_wrap(detail, "   ") for detail in finding.details]
        lines.append("   What to do next:")
        lines += [_wrap(step, "   - ", "     ") for step in finding.next_steps]
    return "\n".join(lines) + "\n"


def _overview(f: Figures) -> list[str]:
    busy = f.compile_seconds + f.execute_seconds
    share = f" ({100 * f.compile_seconds / busy:.0f}% of compile + execute time)" if busy > 0 else ""
    calls = sum(count for _, count in f.fallback)
    counted = f"{f.count.steps} ({f.count.basis}; see Steps)" if f.count.steps else f"unknown ({f.count.basis})"
    if f.training_steps:
        training = f"{f.training_steps}, as given with --steps"
    else:
        training = "unknown: a report does not count optimizer steps (give them with --steps N)"
    return [
        f"  training steps:          {training}",
        f"  markers that ran graphs: {counted}",
        f"  step markers (MarkStep): {f.markers}, every sync, also those that ran no graph",
        f"  graphs run:              {f.graphs} ({f.compiles} compiled, {f.cache_hits} from the compile cache); "
        f"{f.per_step(f.graphs)}",
        f"  graph executions:        {f.executions}, {f.execute_seconds:.3f} s executing",
        f"  compilations:            {f.compiles}, {f.compile_seconds:.3f} s compiling{share}",
        f"  host reads:              {f.host_reads} device-to-host transfers ({f.per_step(f.host_reads)}), "
        f"{f.scalar_reads} of them .item()",
        f"  CPU fallback operators:  {plural(len(f.fallback), 'operator')}, {plural(calls, 'call')}",
    ]


def _wrap(text: str, first: str, rest: str | None = None) -> str:
    if text.startswith("  "):  # a table row: keep it as it is
        return first + text
    return textwrap.fill(
        text,
        WIDTH,
        initial_indent=first,
        subsequent_indent=rest or first,
        break_long_words=False,
        break_on_hyphens=False,
    )
