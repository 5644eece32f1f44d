"""The torch_compile_* families of one training process, read from the ``TorchCompileSource`` at each scrape."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, Metric

from ...metric_family import readable_family
from ...untrusted import LabelBudget
from ..sites import UNKNOWN
from .probes import OFF, READABLE
from .records import BreakRecord, FunctionRecord

FAMILIES = {
    "torch_compile_compilations": (
        "Frames compiled by torch.compile (dynamo), by the compiled function's first line",
        ["location"],
    ),
    "torch_compile_recompilations": (
        "Recompilations by torch.compile after a guard failed, by the compiled "
        "function's first line and the kind of guard",
        ["location", "reason"],
    ),
    "torch_compile_graph_breaks": (
        "Graph breaks found by torch.compile while compiling, by the user line that "
        "broke the graph and the kind of reason",
        ["location", "reason"],
    ),
    "torch_compile_recompile_limit_hits": (
        "Functions that hit torch.compile's recompile limit and run eagerly from then on, by the function's first line",
        ["location"],
    ),
}


class TorchCompileFamilies:
    def __init__(self, source, max_site_series: int):
        """``source``: the ``TorchCompileSource`` (its ``version``, ``mode``, ``readable`` and ``snapshot()``)."""
        self.source = source
        self._budgets = {name: LabelBudget(max_site_series) for name in FAMILIES}

    def families(self, labels: dict[str, str]) -> Iterator[Metric]:
        """The ``torch_compile_*`` families of this rank that this torch lets it read, and which those are."""
        source = self.source
        if not source.version:
            return  # never installed
        yield readable_family(
            "neuron_exporter_torch_compile_readable",
            "1 if the exporter reads this record "
            "of torch.compile on this torch, 0 if the private API of torch it comes from is "
            "missing or of a shape the exporter does not know (the log says which), by record",
            labels,
            READABLE,
            source.readable,
        )
        if source.mode == OFF:
            return
        names, values = list(labels), list(labels.values())
        functions, breaks, seconds, counted = source.snapshot()
        if "source_lines" not in source.readable:  # compilations counted from the compile callbacks, without lines
            functions = [FunctionRecord(UNKNOWN, compilations=counted)]
        for name, (documentation, extra) in FAMILIES.items():
            if name.removeprefix("torch_compile_") not in source.readable:
                continue
            budget = self._budgets[name]
            totals: dict[tuple[str, ...], float] = {}
            for key, value in _values(name, functions, breaks):
                key = (budget.label_for(key[0]), *key[1:])
                totals[key] = totals.get(key, 0) + value
            counter = CounterMetricFamily(name, documentation, labels=names + extra)
            for key, value in sorted(totals.items()):
                counter.add_metric(values + list(key), value)
            yield counter
        if "compile_seconds" in source.readable:
            total = CounterMetricFamily(
                "torch_compile_compile_seconds",
                "Time torch.compile spent compiling (dynamo and the backend, forward and backward graphs)",
                labels=names,
            )
            total.add_metric(values, seconds)
            yield total


def _values(family: str, functions: list[FunctionRecord], breaks: list[BreakRecord]):
    """((location, other label values...), value) of one family."""
    if family == "torch_compile_compilations":
        return [((f.location,), f.compilations) for f in functions if f.compilations]
    if family == "torch_compile_recompilations":
        return [((f.location, kind), count) for f in functions for kind, count in f.recompilations.items()]
    if family == "torch_compile_recompile_limit_hits":
        return [((f.location,), f.limit_hits) for f in functions if f.limit_hits]
    return [((b.location, b.reason), b.count) for b in breaks]
