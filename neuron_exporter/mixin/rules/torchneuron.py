"""The alerts of TorchNeuron (the native ``neuron`` device), per run: CPU-fallback operators and host reads, with the
thresholds and runbook of their torch_xla counterparts. Its recompilations are torch.compile's
(``TorchCompileRecompiling``)."""

from __future__ import annotations

from ...catalogue import NEURON_FALLBACK_CALLS, NEURON_FALLBACK_OPS_SEEN, NEURON_HOST_READS, TRAINING_STEPS
from ..config import Config
from .promql import RANK, alert, fill, labels, rank_lookup, run_name, select


def torchneuron_alerts(c: Config) -> list[dict]:
    """Per run: an operator TorchNeuron runs on the CPU (counted per call and called in the window, or only in its
    set of names, which has no counts), host reads per training step."""
    run = labels(*c.run_labels)
    rank = labels(*c.rank_labels)
    the_run = run_name(c)
    host_reads_per_step = fill(
        """
        sum by (${rank}) (rate(${host_reads}[5m]))
        /
        (sum by (${rank}) (rate(${steps}[5m])) > 0)
        """,
        rank=rank,
        host_reads=select(c, NEURON_HOST_READS.name),
        steps=select(c, TRAINING_STEPS.name),
    )
    return [
        alert(
            c,
            "TorchNeuronCpuFallbackOp",
            c.fallback_for,
            c.fallback_severity,
            expr=fill(
                """
                count by (${run_op}) (
                  sum by (${rank_op}) (increase(${calls}[${window}])) > 0
                  or
                  (max by (${rank_op}) (${seen}) unless on (${rank_op}) sum by (${rank_op}) (${calls}))
                )
                """,
                run_op=labels(*c.run_labels, "op"),
                rank_op=labels(*c.rank_labels, "op"),
                calls=select(c, NEURON_FALLBACK_CALLS.name),
                seen=select(c, NEURON_FALLBACK_OPS_SEEN.name),
                window=c.fallback_window,
            ),
            summary=fill(
                "Operator {{ $labels.op }} runs on the CPU on the neuron device in ${run_name}", run_name=the_run
            ),
            description=fill(
                "TorchNeuron ran {{ $labels.op }} on the CPU in ${run_name}: in the last ${window} if it counts its "
                "calls, at least once if it only lists it (an operator with no Neuron kernel). Ranks affected: "
                "{{ $value }}${most_calls}${seen_on}. Every call synchronizes the device and copies its tensors to "
                "the host and back. Every rank: the TorchNeuron dashboard.",
                run_name=the_run,
                window=c.fallback_window,
                most_calls=rank_lookup(
                    c,
                    "topk(1, sum by (instance, rank, local_rank) (increase(${calls}{${match}}[${window}])) > 0)",
                    fill('; most calls: ${rank} ({{ value . | printf "%.0f" }})', rank=RANK),
                    "op",
                    window=c.fallback_window,
                    calls=NEURON_FALLBACK_CALLS.name,
                ),
                seen_on=rank_lookup(
                    c,
                    "topk(1, max by (instance, rank, local_rank) (${seen}{${match}}) "
                    "unless on (instance, rank, local_rank) "
                    "sum by (instance, rank, local_rank) (${calls}{${match}}))",
                    fill("; seen on ${rank}", rank=RANK),
                    "op",
                    seen=NEURON_FALLBACK_OPS_SEEN.name,
                    calls=NEURON_FALLBACK_CALLS.name,
                ),
            ),
        ),
        alert(
            c,
            "TorchNeuronFrequentHostReads",
            c.host_reads_for,
            c.host_reads_severity,
            expr=fill(
                """
                count by (${run}) (
                  ${per_step} > ${threshold}
                )
                """,
                run=run,
                per_step=host_reads_per_step,
                threshold=f"{c.host_reads_per_step:g}",
            ),
            summary=fill("Neuron device data is read on the host every step in ${run_name}", run_name=the_run),
            description=fill(
                "More than ${threshold} host reads of neuron tensors per training step in ${run_name}. Ranks "
                "affected: {{ $value }}; worst: ${worst}. Each read waits for the device. Every rank and line: the "
                "TorchNeuron dashboard.",
                threshold=f"{c.host_reads_per_step:g}",
                run_name=the_run,
                worst=rank_lookup(
                    c,
                    "topk(1, sum by (instance, rank, local_rank) (rate(${reads}{${match}}[5m])) "
                    "/ on (instance, rank, local_rank) "
                    "(sum by (instance, rank, local_rank) (rate(${steps}{${match}}[5m])) > 0))",
                    fill('${rank} with {{ value . | printf "%.2f" }} per step', rank=RANK),
                    reads=NEURON_HOST_READS.name,
                    steps=TRAINING_STEPS.name,
                ),
            ),
        ),
    ]
