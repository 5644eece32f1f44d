"""The alerts of torch.compile (dynamo), whatever the backend, per run."""

from __future__ import annotations

from ...catalogue import COMPILE_GRAPH_BREAKS, COMPILE_LIMIT_HITS, COMPILE_RECOMPILATIONS, PROCESS_CPU
from ..config import Config
from .promql import RANK, alert, fill, labels, rank_lookup, run_name, select


def torch_compile_alerts(c: Config) -> list[dict]:
    """torch.compile (dynamo), whatever the backend: recompilations that go on after warm-up, functions at the
    recompile limit, graph breaks found after warm-up. A rank is warmed up once its process has run for
    ``torch_compile_warmup_window``: its CPU-time counter existed that long ago and has not been reset since (a
    restarted process compiles afresh)."""
    the_run = run_name(c)
    window, warmup = c.torch_compile_window, c.torch_compile_warmup_window

    def after_warmup(metric: str) -> str:
        """The ranks of each run on which a counter gained over the window, once warmed up. A series that
        appeared within the window counts from 0 (a new line or reason is exported from its first count on,
        which increase() would miss)."""
        return fill(
            """
            count by (${run}) (
              (
                sum by (${rank}) (${counter})
                - (sum by (${rank}) (${counter} offset ${window}) or 0 * sum by (${rank}) (${counter}))
              ) > 0
              and on (${rank})
              (
                max by (${rank}) (${cpu} offset ${warmup})
                unless on (${rank})
                max by (${rank}) (resets(${cpu}[${warmup}])) > 0
              )
            )
            """,
            run=labels(*c.run_labels),
            rank=labels(*c.rank_labels),
            counter=select(c, metric),
            cpu=select(c, PROCESS_CPU.name),
            window=window,
            warmup=warmup,
        )

    # What a counter gained over the window in the alert's run, per ``by`` (as in after_warmup).
    gained = (
        "topk(1, sum by (${by}) (${counter}{${match}}) - (sum by (${by}) (${counter}{${match}} offset ${window})"
        " or 0 * sum by (${by}) (${counter}{${match}})))"
    )

    def most_gained(metric: str, what: str) -> str:
        return rank_lookup(
            c,
            gained,
            fill('${rank} ({{ value . | printf "%.0f" }} ${what})', rank=RANK, what=what),
            by="instance, rank, local_rank",
            counter=metric,
            window=window,
        )

    def top_line(metric: str, what: str) -> str:
        return rank_lookup(
            c,
            gained,
            fill(
                ' Top line: {{ label "location" . }} ({{ label "reason" . }}), {{ value . | printf "%.0f" }} '
                "${what} in the last ${window} over the run's ranks.",
                what=what,
                window=window,
            ),
            by="location, reason",
            counter=metric,
            window=window,
        )

    return [
        alert(
            c,
            "TorchCompileRecompiling",
            c.torch_compile_recompile_for,
            c.torch_compile_recompile_severity,
            expr=after_warmup(COMPILE_RECOMPILATIONS.name),
            summary=fill("torch.compile keeps recompiling after warm-up in ${run_name}", run_name=the_run),
            description=fill(
                "torch.compile recompiled functions after a guard failed, in every ${window} for ${for_}, on ranks "
                "that have run for more than ${warmup} in ${run_name}. Ranks affected: {{ $value }}; most "
                "recompilations: ${most}.${top_line} Each recompilation stops the step while dynamo and the backend "
                "compile. Every rank, function and line: the torch.compile dashboard; neuron-exporter diagnose on a "
                "rank's endpoint shows the guards that failed.",
                window=window,
                for_=c.torch_compile_recompile_for,
                warmup=warmup,
                run_name=the_run,
                most=most_gained(COMPILE_RECOMPILATIONS.name, "recompilations"),
                top_line=top_line(COMPILE_RECOMPILATIONS.name, "recompilations"),
            ),
        ),
        alert(
            c,
            "TorchCompileRecompileLimit",
            c.torch_compile_limit_for,
            c.torch_compile_limit_severity,
            expr=fill(
                """
                count by (${run_location}) (
                  sum by (${rank_location}) (${limit_hits}) > 0
                )
                """,
                run_location=labels(*c.run_labels, "location"),
                rank_location=labels(*c.rank_labels, "location"),
                limit_hits=select(c, COMPILE_LIMIT_HITS.name),
            ),
            summary=fill(
                "A function at {{ $labels.location }} hit torch.compile's recompile limit in ${run_name}",
                run_name=the_run,
            ),
            description=fill(
                "The function at {{ $labels.location }} recompiled torch._dynamo.config.recompile_limit times and "
                "runs without compiling from then on in ${run_name}. Ranks affected: {{ $value }}, for example "
                "${example}. Every rank, function and line: the torch.compile dashboard; neuron-exporter diagnose "
                "on a rank's endpoint shows the guards that failed.",
                run_name=the_run,
                example=rank_lookup(
                    c,
                    "topk(1, sum by (instance, rank, local_rank) (${limit_hits}{${match}}))",
                    RANK,
                    "location",
                    limit_hits=COMPILE_LIMIT_HITS.name,
                ),
            ),
        ),
        alert(
            c,
            "TorchCompileGraphBreaks",
            c.torch_compile_graph_break_for,
            c.torch_compile_graph_break_severity,
            expr=after_warmup(COMPILE_GRAPH_BREAKS.name),
            summary=fill("torch.compile found new graph breaks after warm-up in ${run_name}", run_name=the_run),
            description=fill(
                "torch.compile broke graphs in the last ${window} on ranks that have run for more than ${warmup} "
                "in ${run_name}: a code path compiled late, or a recompilation that breaks. Ranks affected: "
                "{{ $value }}; most graph breaks: ${most}.${top_line} The code between two graphs runs eagerly at "
                "every call. Every rank, function and line: the torch.compile dashboard; neuron-exporter diagnose "
                "on a rank's endpoint shows dynamo's reason.",
                window=window,
                warmup=warmup,
                run_name=the_run,
                most=most_gained(COMPILE_GRAPH_BREAKS.name, "graph breaks"),
                top_line=top_line(COMPILE_GRAPH_BREAKS.name, "graph breaks"),
            ),
        ),
    ]
