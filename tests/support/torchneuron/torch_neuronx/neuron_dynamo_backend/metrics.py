"""``NeuronCompilationMetrics``: one record per forward-compiler call, read with ``get_dynamo_metrics()``, which
synchronizes the device first (the compile times of the last graphs are filled in at a sync)."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from .. import _C

_lock = threading.Lock()
_records: list[NeuronCompilationMetrics] = []


@dataclass
class NeuronCompilationMetrics:
    graph_id: str
    graph_name: str
    model_name: str
    has_collectives: bool
    graph_node_count: int
    timestamp: str
    torch_neuronx_fx_passes_us: int = 0
    torch_neuronx_lower_us: int = 0
    torch_neuronx_compile_us: int = 0


def record_compilation(record: NeuronCompilationMetrics) -> None:
    with _lock:
        _records.append(record)


def get_dynamo_metrics() -> list[NeuronCompilationMetrics]:
    _C._synchronize()
    with _lock:
        return list(_records)


def reset_dynamo_metrics() -> None:
    with _lock:
        _records.clear()
