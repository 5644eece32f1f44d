"""Host metrics for the node endpoint (psutil): CPU time by mode and memory.

They carry no rank label: they describe the machine, and join with the per-rank series on the target's
``instance`` label. Each rank's own process memory and CPU time come with its series (``training_process_*``).
"""

from __future__ import annotations

from collections.abc import Iterator

import psutil
from prometheus_client.core import Metric

from .. import catalogue
from ..metric_family import labelled_family, new_family, single_series

# Linux counts guest time inside user and nice already; leaving it out keeps the modes summable.
GUEST_MODES = ("guest", "guest_nice")


class HostCollector:
    def describe(self) -> Iterator[Metric]:
        yield new_family(catalogue.HOST_CPU, {})
        yield new_family(catalogue.HOST_MEMORY_TOTAL, {})
        yield new_family(catalogue.HOST_MEMORY_AVAILABLE, {})

    def collect(self) -> Iterator[Metric]:
        modes = psutil.cpu_times()._asdict().items()
        yield labelled_family(catalogue.HOST_CPU, {}, [((mode,), s) for mode, s in modes if mode not in GUEST_MODES])
        memory = psutil.virtual_memory()
        yield single_series(catalogue.HOST_MEMORY_TOTAL, {}, memory.total)
        yield single_series(catalogue.HOST_MEMORY_AVAILABLE, {}, memory.available)
