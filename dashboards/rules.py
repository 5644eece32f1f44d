"""Prometheus recording and alert rules for neuron-exporter, generated from the thresholds in config.py.

Recording rules hold the per-rank ratios that the alerts compare (and that ad-hoc queries can reuse);
they use a fixed 5m window so their names stay stable. Every alert carries a ``severity`` label and the
annotations ``summary``, ``description`` and ``runbook_url`` (an anchor in deploy/prometheus/runbook.md named
after the alert).
"""

from __future__ import annotations

from .config import DEFAULTS, RUNBOOK_URL, Thresholds

ALERTS_FILE = "neuron-exporter-alerts.yml"
RECORDING_FILE = "neuron-exporter-recording.yml"

RANK = "job, instance, rank, local_rank"
WINDOW = "5m"

# name -> expression; evaluated in this order, so later rules may use earlier ones.
RECORDING_RULES = {
    f"rank:xla_steps:rate{WINDOW}":
        f"sum by ({RANK}) (rate(xla_steps_total[{WINDOW}]))",
    f"rank:xla_graphs_per_step:avg{WINDOW}":
        f"sum by ({RANK}) (rate(xla_graphs_per_step_sum[{WINDOW}]))\n"
        f"/\nsum by ({RANK}) (rate(xla_graphs_per_step_count[{WINDOW}]))",
    f"rank:xla_fragmented_steps:ratio{WINDOW}":
        f"sum by ({RANK}) (rate(xla_fragmented_steps_total[{WINDOW}]))\n/\nrank:xla_steps:rate{WINDOW}",
    f"rank:xla_recompilations_per_step:ratio{WINDOW}":
        f"sum by ({RANK}) (rate(xla_recompilations_total[{WINDOW}]))\n/\nrank:xla_steps:rate{WINDOW}",
    f"rank:xla_device_to_host_transfers_per_step:ratio{WINDOW}":
        f"sum by ({RANK}) (rate(xla_device_to_host_transfers_total[{WINDOW}]))\n/\nrank:xla_steps:rate{WINDOW}",
    f"rank:xla_compile_time_share:ratio{WINDOW}":
        f"sum by ({RANK}) (rate(xla_compile_seconds_total[{WINDOW}]))\n"
        f"/\nsum by ({RANK}) (rate(xla_step_duration_seconds_sum[{WINDOW}]))",
    f"rank:xla_execute_time_share:ratio{WINDOW}":
        f"sum by ({RANK}) (rate(xla_execute_seconds_total[{WINDOW}]))\n"
        f"/\nsum by ({RANK}) (rate(xla_step_duration_seconds_sum[{WINDOW}]))",
    f"rank_op:xla_cpu_fallback_ops:rate{WINDOW}":
        f"sum by ({RANK}, op) (rate(xla_cpu_fallback_ops_total[{WINDOW}]))",
}

WHERE = "rank {{ $labels.rank }} (local rank {{ $labels.local_rank }}) of {{ $labels.instance }}"


def alert(name: str, expr: str, for_: str, severity: str, summary: str, description: str) -> dict:
    return {
        "alert": name,
        "expr": expr,
        "for": for_,
        "labels": {"severity": severity},
        "annotations": {
            "summary": summary,
            "description": description,
            "runbook_url": f"{RUNBOOK_URL}#{name.lower()}",
        },
    }


def alert_rules(t: Thresholds = DEFAULTS) -> list[dict]:
    return [
        alert(
            "XlaCpuFallbackOp",
            f"sum by ({RANK}, op) (increase(xla_cpu_fallback_ops_total[{t.fallback_window}])) > 0",
            t.fallback_for, "warning",
            "Operator {{ $labels.op }} runs on the CPU on rank {{ $labels.rank }}",
            "{{ $labels.op }} has no XLA lowering: it ran on the CPU {{ $value | humanize }} times in the last "
            f"{t.fallback_window} on {WHERE}. Every call cuts the graph and copies its tensors to the host and back.",
        ),
        alert(
            "XlaRecompilationStorm",
            f"rank:xla_recompilations_per_step:ratio{WINDOW} > {t.recompilations_per_step:g}",
            t.recompilation_for, "warning",
            "Rank {{ $labels.rank }} recompiles its graph after warm-up",
            "{{ $value | printf \"%.2f\" }} compiler runs per step after warm-up on " + WHERE +
            f" (threshold {t.recompilations_per_step:g}). Input shapes or graph structure keep changing.",
        ),
        alert(
            "XlaGraphFragmentation",
            f"rank:xla_graphs_per_step:avg{WINDOW} > {t.graphs_per_step:g}",
            t.fragmentation_for, "warning",
            "Rank {{ $labels.rank }} runs more than one graph per step",
            "{{ $value | printf \"%.2f\" }} graphs per step on average on " + WHERE +
            f" (threshold {t.graphs_per_step:g}). Something cuts the graph every step: "
            ".item(), print, .cpu() or a CPU-fallback operator.",
        ),
        alert(
            "XlaFrequentHostReads",
            f"rank:xla_device_to_host_transfers_per_step:ratio{WINDOW} > {t.host_reads_per_step:g}",
            t.host_reads_for, "warning",
            "Rank {{ $labels.rank }} reads device data on the host every step",
            "{{ $value | printf \"%.2f\" }} device-to-host transfers per step on " + WHERE +
            f" (threshold {t.host_reads_per_step:g}). Each read waits for the device and may cut the graph.",
        ),
        alert(
            "XlaCompileTimeDominates",
            f"rank:xla_compile_time_share:ratio{WINDOW} > {t.compile_time_share:g}",
            t.compile_time_for, "warning",
            "Rank {{ $labels.rank }} spends most of its step time compiling",
            "Compilation took {{ $value | humanizePercentage }} of the step wall time on " + WHERE +
            f" (threshold {t.compile_time_share:.0%}).",
        ),
        alert(
            "XlaTrainingStalled",
            f"sum by ({RANK}) (increase(xla_steps_total[{t.stall_window}])) == 0\n"
            f"unless on ({RANK}) (neuron_exporter_rank_state{{state=~\"hung|dead\"}} == 1)",
            t.stall_for, "warning",
            "Rank {{ $labels.rank }} has ended no step for " + t.stall_window,
            f"No training step ended in the last {t.stall_window} on " + WHERE +
            ", while its metrics endpoint still answers.",
        ),
        alert(
            "NeuronExporterRankHung",
            f"max by ({RANK}) (neuron_exporter_rank_state{{state=\"hung\"}}) == 1",
            t.rank_hung_for, "critical",
            "Rank {{ $labels.rank }} has stopped reporting",
            "The node endpoint {{ $labels.instance }} marks rank {{ $labels.rank }} (local rank "
            "{{ $labels.local_rank }}) as hung: its process is alive but it has not reported a step within "
            "the configured time.",
        ),
        alert(
            "NeuronExporterRankDead",
            f"max by ({RANK}) (neuron_exporter_rank_state{{state=\"dead\"}}) == 1",
            t.rank_dead_for, "critical",
            "Rank {{ $labels.rank }} process is gone",
            "The node endpoint {{ $labels.instance }} marks rank {{ $labels.rank }} (local rank "
            "{{ $labels.local_rank }}) as dead: its process exited. Its last counters stay visible until they expire.",
        ),
        alert(
            "NeuronExporterDown",
            f"up{{{t.exporter_job_selector}}} == 0",
            t.exporter_down_for, "warning",
            "neuron-exporter endpoint {{ $labels.instance }} is down",
            "Prometheus cannot scrape {{ $labels.instance }} (job {{ $labels.job }}): the training process or the "
            "node daemon is not serving /metrics.",
        ),
        alert(
            "NeuronExporterCollectionErrors",
            f"sum by ({RANK}, stage) (increase(neuron_exporter_collection_errors_total"
            f"[{t.collection_errors_window}])) > 0",
            t.collection_errors_for, "warning",
            "neuron-exporter fails to collect ({{ $labels.stage }}) on rank {{ $labels.rank }}",
            "{{ $value | humanize }} collection errors at stage {{ $labels.stage }} in the last "
            f"{t.collection_errors_window} on {WHERE}. The metrics of this rank may be incomplete.",
        ),
        alert(
            "NeuronExporterCollectorFailing",
            "neuron_exporter_collector_success == 0",
            t.collector_failing_for, "warning",
            "neuron-exporter collector {{ $labels.collector }} fails on {{ $labels.instance }}",
            "The last run of collector {{ $labels.collector }} failed on {{ $labels.instance }}"
            "{{ if $labels.rank }} (rank {{ $labels.rank }}){{ end }}; its series are missing or stale.",
        ),
    ]


def recording_rules() -> list[dict]:
    return [{"record": name, "expr": expr} for name, expr in RECORDING_RULES.items()]


def rule_files(t: Thresholds = DEFAULTS) -> dict[str, dict]:
    """{file name: rule file content} for the two files Prometheus loads."""
    return {
        RECORDING_FILE: {"groups": [{"name": "neuron-exporter.recording", "rules": recording_rules()}]},
        ALERTS_FILE: {"groups": [{"name": "neuron-exporter.alerts", "rules": alert_rules(t)}]},
    }
