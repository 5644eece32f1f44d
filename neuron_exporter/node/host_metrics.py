"""Host metrics for the node endpoint (psutil): CPU time by mode and memory.

They carry no rank label: they describe the machine, and join with the per-rank series on the target's
``instance`` label. Each rank's own process memory and CPU time come with its series (``training_process_*``).
"""

from __future__ import annotations

from collections.abc import Iterator

import psutil
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

# Linux counts guest time inside user and nice already; leaving it out keeps the modes summable.
GUEST_MODES = ("guest", "guest_nice")


class HostCollector:
    def describe(self) -> Iterator[Metric]:
        yield CounterMetricFamily(
            "neuron_exporter_host_cpu_seconds", "CPU time of the host, all cores, by mode", labels=["mode"]
        )
        yield GaugeMetricFamily("neuron_exporter_host_memory_total_bytes", "Physical memory of the host")
        yield GaugeMetricFamily(
            "neuron_exporter_host_memory_available_bytes",
            "Memory of the host available to new processes without swapping",
        )

    def collect(self) -> Iterator[Metric]:
        cpu = CounterMetricFamily(
            "neuron_exporter_host_cpu_seconds", "CPU time of the host, all cores, by mode", labels=["mode"]
        )
        for mode, seconds in psutil.cpu_times()._asdict().items():
            if mode not in GUEST_MODES:
                cpu.add_metric([mode], seconds)
        yield cpu
        memory = psutil.virtual_memory()
        yield GaugeMetricFamily(
            "neuron_exporter_host_memory_total_bytes", "Physical memory of the host", value=memory.total
        )
        yield GaugeMetricFamily(
            "neuron_exporter_host_memory_available_bytes",
            "Memory of the host available to new processes without swapping",
            value=memory.available,
        )
