"""Turn a Snapshot into Prometheus metric families: the named signals plus a generic export of the rest.

Named signals come from the counters and metrics that say something about fragmentation, recompiles,
transfers and CPU fallbacks. Every other counter and metric is exported under a generic name, so a
user can graph anything torch_xla records without waiting for a release of this exporter.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric

from . import catalogue
from .catalogue import Family
from .metric_family import labelled_family, single_series
from .snapshot import BYTES, SECONDS, Snapshot
from .untrusted import LabelBudget

HOST_SCALAR_READ_OP = "aten::_local_scalar_dense"  # what .item() runs: a host read, not a missing lowering
LOWERED_OP_PREFIX = "xla::"  # torch_xla's counter of each operator it lowers
DEFAULT_MAX_OP_SERIES = 100

EXECUTE_METRICS = ("ExecuteTime", "ExecuteReplicatedTime")  # a graph run: on one device, or replicated
# (family of the sample counts, family of the accumulators, torch_xla metric names whose values are summed)
TIMED_SIGNALS = (
    (catalogue.XLA_GRAPH_EXECUTIONS, catalogue.XLA_EXECUTE_SECONDS, EXECUTE_METRICS),
    (catalogue.XLA_DEVICE_TO_HOST, catalogue.XLA_FROM_DEVICE_SECONDS, ("TransferFromDeviceTime",)),
    (catalogue.XLA_HOST_TO_DEVICE, catalogue.XLA_TO_DEVICE_SECONDS, ("TransferToDeviceTime",)),
)

GENERIC_FAMILIES = {SECONDS: catalogue.XLA_METRIC_SECONDS, BYTES: catalogue.XLA_METRIC_BYTES}


def is_cpu_fallback_op(counter_name: str) -> bool:
    """Whether a torch_xla counter counts the calls of an operator that ran on the CPU (no XLA lowering).

    torch_xla's CPU fallback (torch_xla/csrc/aten_fallback.cpp) serves every operator without an XLA
    kernel, whatever its namespace, and counts each one under the operator's own name: ``aten::lgamma``,
    ``torchvision::roi_align``, ``torchvision::_roi_align_backward``, a custom ``mylib::op``. So every
    ``namespace::op`` counter is one, but torch_xla's own ``xla::`` counters (lowered operators) and
    ``aten::_local_scalar_dense``, which is what ``.item()`` runs: a host read, not a missing lowering.
    """
    namespace, separator, op = counter_name.partition("::")
    return (
        bool(separator and namespace and op)
        and not counter_name.startswith(LOWERED_OP_PREFIX)
        and counter_name != HOST_SCALAR_READ_OP
    )


def snapshot_families(
    snapshot: Snapshot,
    labels: dict[str, str],
    fallback_budget: LabelBudget | None = None,
    lowered_budget: LabelBudget | None = None,
) -> Iterator[Metric]:
    """Yield the metric families of one snapshot, every series carrying ``labels`` (e.g. rank)."""
    fallback_budget = fallback_budget or LabelBudget(DEFAULT_MAX_OP_SERIES)
    lowered_budget = lowered_budget or LabelBudget(DEFAULT_MAX_OP_SERIES)

    yield single_series(catalogue.XLA_COMPILATIONS, labels, snapshot.counter("UncachedCompile"))
    yield single_series(catalogue.XLA_GRAPH_CACHE_HITS, labels, snapshot.counter("CachedCompile"))
    yield single_series(catalogue.XLA_COMPILE_SECONDS, labels, snapshot.metric("CompileTime").accumulator)
    for count_family, seconds_family, sources in TIMED_SIGNALS:
        metrics = [snapshot.metric(source) for source in sources]
        yield single_series(count_family, labels, sum(m.total_samples for m in metrics))
        yield single_series(seconds_family, labels, sum(m.accumulator for m in metrics))
    yield single_series(catalogue.XLA_HOST_SCALAR_READS, labels, snapshot.counter(HOST_SCALAR_READ_OP))

    fallback: list[tuple[tuple[str], float]] = []
    lowered: list[tuple[tuple[str], float]] = []
    other_counters: list[tuple[tuple[str], float]] = []
    for name, value in snapshot.counters.items():
        if name == HOST_SCALAR_READ_OP:
            continue
        if is_cpu_fallback_op(name):
            fallback.append(((name,), value))
        elif name.startswith(LOWERED_OP_PREFIX):
            lowered.append(((name,), value))
        else:
            other_counters.append(((name,), value))
    yield labelled_family(catalogue.XLA_FALLBACK_OPS, labels, fallback, {"op": fallback_budget})
    yield labelled_family(catalogue.XLA_LOWERED_OPS, labels, lowered, {"op": lowered_budget})
    yield labelled_family(catalogue.XLA_EVENTS, labels, other_counters)

    metric_values = sorted(snapshot.metrics.items())
    yield labelled_family(
        catalogue.XLA_METRIC_SAMPLES, labels, [((name,), m.total_samples) for name, m in metric_values]
    )
    by_unit: dict[Family, list[tuple[tuple[str], float]]] = {family: [] for family in GENERIC_FAMILIES.values()}
    by_unit[catalogue.XLA_METRIC_VALUE] = []
    for name, metric in metric_values:
        by_unit[GENERIC_FAMILIES.get(metric.unit, catalogue.XLA_METRIC_VALUE)].append(((name,), metric.accumulator))
    for unit_family, values in by_unit.items():
        yield labelled_family(unit_family, labels, values)
