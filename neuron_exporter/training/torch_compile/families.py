"""The torch_compile_* families of one training process, read from the ``TorchCompileSource`` at each scrape."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric

from ... import catalogue
from ...metric_family import labelled_family, readable_family, single_series
from ...untrusted import LabelBudget
from ..sites import UNKNOWN
from .probes import OFF, READABLE
from .records import BreakRecord, FunctionRecord

# The families of a record of READABLE, each named for it.
FAMILIES = {
    "compilations": catalogue.COMPILE_COMPILATIONS,
    "recompilations": catalogue.COMPILE_RECOMPILATIONS,
    "graph_breaks": catalogue.COMPILE_GRAPH_BREAKS,
    "recompile_limit_hits": catalogue.COMPILE_LIMIT_HITS,
}


class TorchCompileFamilies:
    def __init__(self, source, max_site_series: int):
        """``source``: the ``TorchCompileSource`` (its ``version``, ``mode``, ``readable`` and ``snapshot()``)."""
        self.source = source
        self._budgets = {record: LabelBudget(max_site_series) for record in FAMILIES}

    def families(self, labels: dict[str, str]) -> Iterator[Metric]:
        """The ``torch_compile_*`` families of this rank that this torch lets it read, and which those are."""
        source = self.source
        if not source.version:
            return  # never installed
        yield readable_family(catalogue.COMPILE_READABLE, labels, READABLE, source.readable)
        if source.mode == OFF:
            return
        functions, breaks, seconds, counted = source.snapshot()
        if "source_lines" not in source.readable:  # compilations counted from the compile callbacks, without lines
            functions = [FunctionRecord(UNKNOWN, compilations=counted)]
        for record, family in FAMILIES.items():
            if record in source.readable:
                values = _values(record, functions, breaks)
                yield labelled_family(family, labels, values, {"location": self._budgets[record]})
        if "compile_seconds" in source.readable:
            yield single_series(catalogue.COMPILE_SECONDS, labels, seconds)


def _values(record: str, functions: list[FunctionRecord], breaks: list[BreakRecord]):
    """((location, other label values...), value) of the family of one record."""
    if record == "compilations":
        return [((f.location,), f.compilations) for f in functions if f.compilations]
    if record == "recompilations":
        return [((f.location, kind), count) for f in functions for kind, count in f.recompilations.items()]
    if record == "recompile_limit_hits":
        return [((f.location,), f.limit_hits) for f in functions if f.limit_hits]
    return [((b.location, b.reason), b.count) for b in breaks]
