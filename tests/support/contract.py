"""The metric names the dashboards and rules may use (the exporter's contract) and a PromQL name extractor."""

from __future__ import annotations

import re

CONTRACT_COUNTERS_AND_GAUGES = {
    "training_steps_total",
    "training_time_seconds_total",
    "xla_steps_total",
    "xla_fragmented_steps_total",
    "xla_compilations_total",
    "xla_graph_cache_hits_total",
    "xla_recompilations_total",
    "xla_compile_seconds_total",
    "xla_graph_executions_total",
    "xla_execute_seconds_total",
    "xla_device_to_host_transfers_total",
    "xla_transfer_from_device_seconds_total",
    "xla_host_to_device_transfers_total",
    "xla_transfer_to_device_seconds_total",
    "xla_cpu_fallback_ops_total",
    "xla_cpu_fallback_site_info",
    "xla_host_scalar_reads_total",
    "xla_lowered_ops_total",
    "xla_events_total",
    "xla_metric_samples_total",
    "xla_metric_seconds_total",
    "xla_metric_bytes_total",
    "xla_metric_value_total",
    "training_process_resident_memory_bytes",
    "training_process_cpu_seconds_total",
    "training_process_threads",
    # Served in torch_xla processes for one release more (CHANGELOG 0.2.0): the training_process_* names replace them.
    "xla_process_resident_memory_bytes",
    "xla_process_cpu_seconds_total",
    "xla_process_threads",
    "neuron_exporter_build_info",
    "neuron_exporter_collection_errors_total",
    "neuron_exporter_collector_success",
    "neuron_exporter_collector_duration_seconds",
    "neuron_exporter_step_hook_seconds_total",
    "neuron_exporter_syncs_total",
    "neuron_exporter_warmup_steps",
    "neuron_exporter_rank_up",
    "neuron_exporter_rank_state",
    "neuron_exporter_rank_last_report_timestamp_seconds",
    "neuron_exporter_ranks",
    "neuron_exporter_host_cpu_seconds_total",
    "neuron_exporter_host_memory_total_bytes",
    "neuron_exporter_host_memory_available_bytes",
    "neuron_exporter_spool_rejected_files",
    "neuron_exporter_spool_directory_ok",
    "neuron_exporter_rank_info",
    "neuron_exporter_source_started",
    "xla_graph_cuts_total",
    "xla_step_markers_total",
    "xla_new_graphs_total",
    "xla_host_reads_total",
    "torch_compile_compilations_total",
    "torch_compile_recompilations_total",
    "torch_compile_graph_breaks_total",
    "torch_compile_recompile_limit_hits_total",
    "torch_compile_compile_seconds_total",
    "neuron_exporter_torch_compile_readable",
    "torchneuron_cpu_fallback_op_calls_total",
    "torchneuron_cpu_fallback_site_info",
    "torchneuron_cpu_fallback_ops_seen",
    "torchneuron_host_reads_total",
    "torchneuron_compile_cache_hits_total",
    "torchneuron_compile_cache_misses_total",
    "torchneuron_compilations_total",
    "torchneuron_compile_seconds_total",
    "torchneuron_compiled_graphs_total",
    "torchneuron_graphs_with_collectives_total",
    "torchneuron_graph_fallbacks_total",
    "torchneuron_memory_allocated_bytes",
    "torchneuron_memory_active_peak_bytes",
    "torchneuron_memory_ooms_total",
    "torchneuron_memory_alloc_retries_total",
    "neuron_exporter_torchneuron_readable",
}


CONTRACT_HISTOGRAMS = {"training_step_duration_seconds", "xla_step_duration_seconds", "xla_graphs_per_step"}


PROMETHEUS_OWN = {"up"}


CONTRACT_METRICS = (
    CONTRACT_COUNTERS_AND_GAUGES
    | PROMETHEUS_OWN
    | {f"{h}{suffix}" for h in CONTRACT_HISTOGRAMS for suffix in ("_bucket", "_sum", "_count")}
)


PROMQL_WORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "inf",
    "nan",
    # aggregation operators, which may stand before their parenthesis: sum by (x) (...)
    "sum",
    "avg",
    "min",
    "max",
    "count",
    "group",
    "stddev",
    "stdvar",
    "topk",
    "bottomk",
    "quantile",
    "count_values",
}


def metric_names(expr: str) -> set[str]:
    """The metric names an expression selects: identifiers that are not functions, keywords or label names."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings (label values, regexes)
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # range and subquery windows
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", r" \1 ", text)  # label lists
    names = set()
    for match in re.finditer(r"(?<![\w.])([A-Za-z_:][A-Za-z0-9_:]*)(\s*\()?", text):
        word, is_call = match.group(1), match.group(2)
        if not is_call and word.lower() not in PROMQL_WORDS:
            names.add(word)
    return names
