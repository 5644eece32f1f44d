"""The alerts of XLA training, per run: CPU-fallback operators, recompilations, graph cuts, host reads, compile
time, stalled training. They read the recording rules (recording.py)."""

from __future__ import annotations

from ...catalogue import RANK_STATE, XLA_FALLBACK_OPS, XLA_STEPS
from ..config import Config
from .promql import RANK, alert, fill, labels, most, rank_lookup, run_name, select, top_site, worst_recorded
from .recording import (
    COMPILE_TIME_SHARE,
    CUTS_PER_STEP,
    HOST_READS_PER_STEP,
    RECOMPILATIONS_PER_STEP,
    SITE_CUTS_PER_STEP,
    SITE_RECOMPILATIONS_PER_STEP,
)


def xla_alerts(c: Config) -> list[dict]:
    """Per run: CPU-fallback operators, recompilations, graph cuts, host reads, compile time, stalled training."""
    run = labels(*c.run_labels)
    rank = labels(*c.rank_labels)
    the_run = run_name(c)

    def over(record: str, op: str, threshold: float) -> str:
        return fill(
            """
            count by (${run}) (
              ${record} ${op} ${threshold}
            )
            """,
            run=run,
            record=record,
            op=op,
            threshold=f"{threshold:g}",
        )

    return [
        alert(
            c,
            "XlaCpuFallbackOp",
            c.fallback_for,
            c.fallback_severity,
            expr=fill(
                """
                count by (${run_op}) (
                  sum by (${rank_op}) (increase(${fallback_ops}[${window}])) > 0
                )
                """,
                run_op=labels(*c.run_labels, "op"),
                rank_op=labels(*c.rank_labels, "op"),
                fallback_ops=select(c, XLA_FALLBACK_OPS.name),
                window=c.fallback_window,
            ),
            summary=fill("Operator {{ $labels.op }} runs on the CPU in ${run_name}", run_name=the_run),
            description=fill(
                "{{ $labels.op }} has no XLA lowering: it ran on the CPU in the last ${window} in ${run_name}. "
                "Ranks affected: {{ $value }}; most calls: ${most_calls}. Every call cuts the graph and copies its "
                "tensors to the host and back. Every rank: the Fragmentation & recompiles dashboard.",
                window=c.fallback_window,
                run_name=the_run,
                most_calls=most(
                    c,
                    "topk(1, sum by (instance, rank, local_rank) (increase(${fallback_ops}{${match}}[${window}])))",
                    c.fallback_window,
                    "op",
                    fallback_ops=XLA_FALLBACK_OPS.name,
                ),
            ),
        ),
        alert(
            c,
            "XlaRecompilationStorm",
            c.recompilation_for,
            c.recompilation_severity,
            expr=over(RECOMPILATIONS_PER_STEP, ">", c.recompilations_per_step),
            summary=fill("The graph keeps recompiling in ${run_name}", run_name=the_run),
            description=fill(
                "More than ${threshold} recompilations per training step after warm-up in ${run_name}. "
                "Ranks affected: {{ $value }}; worst: ${worst}.${top_site} Input shapes or Python values baked "
                "into the graph keep changing; neuron-exporter diagnose on a rank's endpoint names the upload "
                "whose shape changed. Every rank and site: the Fragmentation & recompiles dashboard.",
                threshold=f"{c.recompilations_per_step:g}",
                run_name=the_run,
                worst=worst_recorded(c, RECOMPILATIONS_PER_STEP, '{{ value . | printf "%.2f" }} per step'),
                top_site=top_site(c, SITE_RECOMPILATIONS_PER_STEP, "recompilations"),
            ),
        ),
        alert(
            c,
            "XlaGraphFragmentation",
            c.fragmentation_for,
            c.fragmentation_severity,
            expr=over(CUTS_PER_STEP, ">=", c.graph_cuts_per_step),
            summary=fill("Training steps are cut into several graphs in ${run_name}", run_name=the_run),
            description=fill(
                "At least ${threshold} graph cuts per training step in ${run_name}. Ranks affected: {{ $value }}; "
                "worst: ${worst}.${top_site} Something needs a device value before the step ends: .item(), print, "
                "an if on a tensor, .cpu() or a CPU-fallback operator. Every rank and site: the Fragmentation & "
                "recompiles dashboard.",
                threshold=f"{c.graph_cuts_per_step:g}",
                run_name=the_run,
                worst=worst_recorded(c, CUTS_PER_STEP, '{{ value . | printf "%.2f" }} cuts per step'),
                top_site=top_site(c, SITE_CUTS_PER_STEP, "cuts"),
            ),
        ),
        alert(
            c,
            "XlaFrequentHostReads",
            c.host_reads_for,
            c.host_reads_severity,
            expr=over(HOST_READS_PER_STEP, ">", c.host_reads_per_step),
            summary=fill("Device data is read on the host every step in ${run_name}", run_name=the_run),
            description=fill(
                "More than ${threshold} device-to-host transfers per training step in ${run_name}. Ranks affected: "
                "{{ $value }}; worst: ${worst}. Each read waits for the device and may cut the graph. Every rank: "
                "the Fragmentation & recompiles dashboard.",
                threshold=f"{c.host_reads_per_step:g}",
                run_name=the_run,
                worst=worst_recorded(c, HOST_READS_PER_STEP, '{{ value . | printf "%.2f" }} per step'),
            ),
        ),
        alert(
            c,
            "XlaCompileTimeDominates",
            c.compile_time_for,
            c.compile_time_severity,
            expr=over(COMPILE_TIME_SHARE, ">", c.compile_time_share),
            summary=fill("Compiling takes most of the step time in ${run_name}", run_name=the_run),
            description=fill(
                "Compilation takes more than ${share} of the step wall time in ${run_name}. Ranks affected: "
                "{{ $value }}; worst: ${worst}. Every rank: the Fragmentation & recompiles dashboard.",
                share=f"{c.compile_time_share:.0%}",
                run_name=the_run,
                worst=worst_recorded(c, COMPILE_TIME_SHARE, "{{ value . | humanizePercentage }}"),
            ),
        ),
        alert(
            c,
            "XlaTrainingStalled",
            c.stall_for,
            c.stall_severity,
            expr=fill(
                """
                count by (${run}) (
                  sum by (${rank}) (increase(${steps}[${window}])) == 0
                  unless on (${rank})
                  (max by (${rank}) (${hung_or_dead}) == 1)
                )
                """,
                run=run,
                rank=rank,
                steps=select(c, XLA_STEPS.name),
                window=c.stall_window,
                hung_or_dead=select(c, RANK_STATE.name, 'state=~"hung|dead"'),
            ),
            summary=fill("Training has stalled in ${run_name}", run_name=the_run),
            description=fill(
                "No training step ended in the last ${window} in ${run_name}, while the metrics endpoints still "
                "answer. Ranks affected: {{ $value }}, for example ${example}.",
                window=c.stall_window,
                run_name=the_run,
                example=rank_lookup(
                    c,
                    "topk(1, sum by (instance, rank, local_rank) (increase(${steps}{${match}}[${window}])) == 0)",
                    RANK,
                    window=c.stall_window,
                    steps=XLA_STEPS.name,
                ),
            ),
        ),
    ]
