"""The snapshot model: torch_xla's counters and metrics at one moment, in base units.

Both sources produce it: the live process (``training.xla.reader``) and a saved ``metrics_report()`` text
(``report_parser``). Everything downstream (exposition, ``explain``) works on this model only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

SECONDS = "seconds"
BYTES = "bytes"
NUMBER = "number"

# torch_xla reports time metrics in nanoseconds and byte metrics in bytes, and its Python API does not
# say which is which (torch_xla/csrc/runtime/metrics.h: MetricFnTime / MetricFnBytes / MetricFnValue).
TIME_METRICS = frozenset(
    {
        "CompileTime",
        "ExecuteTime",
        "ExecuteReplicatedTime",
        "TransferToDeviceTime",
        "TransferFromDeviceTime",
        "TransferToDeviceTransformTime",
        "EagerOpCompileTime",
        "EagerOpExecuteTime",
        "ExecuteParallelTime",
        "ExecuteChainedTime",
        "DeconstructTupleTime",
        "ReleaseDataHandlesTime",
        "ReleaseCompileHandlesTime",
        "DeviceLockWait",
        "LazyTracing",
        "IrValueTensorToXlaData",
        "TensorToData",
        "UnwrapXlaData",
        "WrapXlaData",
        "RunCachedGraphInputData",
        "RunCachedGraphOutputData",
        "PersistentCacheLoad",
    }
)
BYTE_METRICS = frozenset({"InboundData", "OutboundData"})


def unit_of(metric_name: str) -> str:
    """The unit of a live torch_xla metric, by name (new ``*Time`` metrics are taken as time)."""
    if metric_name in TIME_METRICS or metric_name.endswith("Time"):
        return SECONDS
    if metric_name in BYTE_METRICS:
        return BYTES
    return NUMBER


@dataclass(frozen=True)
class MetricValue:
    """One torch_xla metric: how many samples were ever recorded and their sum, in base units."""

    total_samples: int
    accumulator: float
    unit: str = NUMBER
    # Only a text report carries percentiles: {0.5: value, 0.99: value, ...}, in the same unit.
    percentiles: dict[float, float] = field(default_factory=dict)


@dataclass
class Snapshot:
    """All counters (name -> value) and metrics (name -> MetricValue) of one process."""

    counters: dict[str, int] = field(default_factory=dict)
    metrics: dict[str, MetricValue] = field(default_factory=dict)

    def counter(self, name: str) -> int:
        return self.counters.get(name, 0)

    def metric(self, name: str) -> MetricValue:
        return self.metrics.get(name, MetricValue(0, 0.0, unit_of(name)))
