"""The device layer's series that the device rows join the ranks to: not the exporter's (the catalogue does not list
them), and named here only, so that a rename is one edit.

neuron-monitor (its Prometheus exporter, ``neuron-monitor-prometheus.py``, port 8000) labels every series with the
EC2 instance (``instance_id``, ``instance_type``, ...), a process's series with its ``runtime_tag`` and a NeuronCore's
with ``neuroncore``: they join a rank's ``neuron_exporter_process_info`` on ``(instance_id, runtime_tag)`` and its
``neuron_exporter_neuroncore_info`` on ``(instance_id, neuroncore)``. Its per-process series exist while the
process's runtime runs.

Neuron Observer (0.2.0, a beta whose names may change before its general availability) names its metrics
``neuron.{scope}.{name}[.{strategy}]``; here as Prometheus writes them, dots as underscores, with the suffixes it may
add as a regular expression. Its series are joined on the Kubernetes ``node`` (``neuron_exporter_rank_info``'s, from
``NODE_NAME``), which the scrape configuration in docs/deployment.md puts on them.
"""

from __future__ import annotations

# neuron-monitor: a process's
NEURONCORE_UTILIZATION = "neuroncore_utilization_ratio"  # {runtime_tag, neuroncore}: 0 to 1
RUNTIME_MEMORY = "neuron_runtime_memory_used_bytes"  # {runtime_tag, memory_location="host"|"neuron_device"}
EXECUTION_ERRORS = "execution_errors_total"  # {runtime_tag, error_type}
# neuron-monitor: the instance's
ECC_EVENTS = "hardware_ecc_events_total"  # {event_type, neuron_device_index}: per device, no process
ECC_UNCORRECTED = 'event_type=~".*_uncorrected"'  # mem_ecc_uncorrected, sram_ecc_uncorrected
ECC_CORRECTED = 'event_type=~".*_corrected"'
INSTANCE_INFO = "instance_info"  # one per instance, always served

# Neuron Observer: neuron.device.mem_ecc_uncorrected (a regular expression of __name__)
OBSERVER_ECC_UNCORRECTED = "neuron_device_mem_ecc_uncorrected(_sum|_total)?"

# The series whose jobs the device job variable lists.
DEVICE_JOB_SERIES = f"{INSTANCE_INFO}|{OBSERVER_ECC_UNCORRECTED}"
# Every neuron-monitor name the dashboards query (Observer's is a pattern).
NEURON_MONITOR_SERIES = frozenset({NEURONCORE_UTILIZATION, RUNTIME_MEMORY, EXECUTION_ERRORS, ECC_EVENTS, INSTANCE_INFO})
