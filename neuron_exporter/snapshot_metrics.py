"""Turn a Snapshot into Prometheus metric families: the named signals plus a generic export of the rest.

Named signals come from the counters and metrics that say something about fragmentation, recompiles,
transfers and CPU fallbacks. Every other counter and metric is exported under a generic name, so a
user can graph anything torch_xla records without waiting for a release of this exporter.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, Metric

from .metric_family import single_series
from .snapshot import BYTES, SECONDS, Snapshot
from .untrusted import LabelBudget

HOST_SCALAR_READ_OP = "aten::_local_scalar_dense"  # what .item() runs: a host read, not a missing lowering
LOWERED_OP_PREFIX = "xla::"  # torch_xla's counter of each operator it lowers
DEFAULT_MAX_OP_SERIES = 100

EXECUTE_METRICS = ("ExecuteTime", "ExecuteReplicatedTime")  # a graph run: on one device, or replicated
# (metric family, HELP, torch_xla metric names whose sample counts / accumulators are summed)
TIMED_SIGNALS = (
    (
        "xla_graph_executions",
        "xla_execute_seconds",
        "Graph executions (ExecuteTime samples)",
        "Device time spent executing graphs (ExecuteTime)",
        EXECUTE_METRICS,
    ),
    (
        "xla_device_to_host_transfers",
        "xla_transfer_from_device_seconds",
        "Reads of device data by the host: .item(), print, .cpu(), CPU fallbacks (TransferFromDeviceTime samples)",
        "Time spent copying device data to the host (TransferFromDeviceTime)",
        ("TransferFromDeviceTime",),
    ),
    (
        "xla_host_to_device_transfers",
        "xla_transfer_to_device_seconds",
        "Uploads of host data to the device (TransferToDeviceTime samples)",
        "Time spent copying host data to the device (TransferToDeviceTime)",
        ("TransferToDeviceTime",),
    ),
)

GENERIC_FAMILIES = {
    SECONDS: ("xla_metric_seconds", "Accumulated value of every torch_xla time metric, by metric name"),
    BYTES: ("xla_metric_bytes", "Accumulated value of every torch_xla byte metric, by metric name"),
}
GENERIC_NUMBER_FAMILY = ("xla_metric_value", "Accumulated value of every other torch_xla metric, by metric name")


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


def _add_labelled(family: CounterMetricFamily, base: list[str], by_label: dict[str, float]) -> None:
    for label, value in sorted(by_label.items()):
        family.add_metric(base + [label], value)


def snapshot_families(
    snapshot: Snapshot,
    labels: dict[str, str],
    fallback_budget: LabelBudget | None = None,
    lowered_budget: LabelBudget | None = None,
) -> Iterator[Metric]:
    """Yield the metric families of one snapshot, every series carrying ``labels`` (e.g. rank)."""
    names = list(labels)
    values = list(labels.values())
    fallback_budget = fallback_budget or LabelBudget(DEFAULT_MAX_OP_SERIES)
    lowered_budget = lowered_budget or LabelBudget(DEFAULT_MAX_OP_SERIES)

    def counter(name: str, documentation: str, value: float) -> Metric:
        return single_series(CounterMetricFamily, name, documentation, labels, value)

    yield counter("xla_compilations", "Real compiler runs (UncachedCompile)", snapshot.counter("UncachedCompile"))
    yield counter(
        "xla_graph_cache_hits",
        "Graphs served from the compile cache (CachedCompile)",
        snapshot.counter("CachedCompile"),
    )
    yield counter(
        "xla_compile_seconds", "Time spent compiling graphs (CompileTime)", snapshot.metric("CompileTime").accumulator
    )
    for count_name, seconds_name, count_help, seconds_help, sources in TIMED_SIGNALS:
        metrics = [snapshot.metric(source) for source in sources]
        yield counter(count_name, count_help, sum(m.total_samples for m in metrics))
        yield counter(seconds_name, seconds_help, sum(m.accumulator for m in metrics))

    yield counter(
        "xla_host_scalar_reads",
        ".item() and other scalar reads by the host (aten::_local_scalar_dense)",
        snapshot.counter(HOST_SCALAR_READ_OP),
    )

    fallback: dict[str, float] = {}
    lowered: dict[str, float] = {}
    other_counters: dict[str, float] = {}
    for name, value in snapshot.counters.items():
        if name == HOST_SCALAR_READ_OP:
            continue
        if is_cpu_fallback_op(name):
            op = fallback_budget.label_for(name)
            fallback[op] = fallback.get(op, 0) + value
        elif name.startswith(LOWERED_OP_PREFIX):
            op = lowered_budget.label_for(name)
            lowered[op] = lowered.get(op, 0) + value
        else:
            other_counters[name] = value

    family = CounterMetricFamily(
        "xla_cpu_fallback_ops",
        "Executions of operators with no XLA lowering, run on the CPU, by operator: every namespace::op counter "
        "(aten::, torchvision::, custom ops) but xla:: and aten::_local_scalar_dense (.item())",
        labels=names + ["op"],
    )
    _add_labelled(family, values, fallback)
    yield family
    family = CounterMetricFamily(
        "xla_lowered_ops", "Operators lowered to XLA (xla:: counters), by operator", labels=names + ["op"]
    )
    _add_labelled(family, values, lowered)
    yield family
    family = CounterMetricFamily(
        "xla_events", "Every other torch_xla counter, by counter name", labels=names + ["counter"]
    )
    _add_labelled(family, values, other_counters)
    yield family

    samples = CounterMetricFamily(
        "xla_metric_samples", "Samples recorded by every torch_xla metric, by metric name", labels=names + ["metric"]
    )
    sums = {
        unit: CounterMetricFamily(name, doc, labels=names + ["metric"])
        for unit, (name, doc) in GENERIC_FAMILIES.items()
    }
    number_sums = CounterMetricFamily(*GENERIC_NUMBER_FAMILY, labels=names + ["metric"])
    for name, metric in sorted(snapshot.metrics.items()):
        samples.add_metric(values + [name], metric.total_samples)
        sums.get(metric.unit, number_sums).add_metric(values + [name], metric.accumulator)
    yield samples
    yield from sums.values()
    yield number_sums
