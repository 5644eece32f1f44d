"""The torch_xla families of one training process: steps, sites (where and why), and torch_xla's own counters and
metrics. Read from the ``XlaSource`` at each scrape (a forked child replaces its tracker and attribution)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import Metric

from ... import catalogue
from ...catalogue import Family
from ...metric_family import histogram_family, labelled_family, single_series
from ...snapshot_metrics import snapshot_families
from ...untrusted import LabelBudget
from ..attribution import SiteRecord
from .reader import MonotonicSnapshots


class XlaFamilies:
    def __init__(self, source, max_op_series: int, max_site_series: int):
        """``source``: the ``XlaSource`` (its ``reader``, ``tracker`` and ``attribution``)."""
        self.source = source
        self._site_budgets = {family: LabelBudget(max_site_series) for family in (*SITE_FAMILIES, FALLBACK_SITES)}
        self._totals = MonotonicSnapshots()
        self._fallback_budget = LabelBudget(max_op_series)
        self._lowered_budget = LabelBudget(max_op_series)

    def parts(self) -> dict[str, Callable[[dict[str, str]], Iterator[Metric]]]:
        return {"steps": self._step_families, "sites": self._site_families, "xla": self._xla_families}

    def _step_families(self, labels: dict[str, str]) -> Iterator[Metric]:
        state = self.source.tracker.state()
        yield single_series(catalogue.XLA_STEPS, labels, state.steps)
        yield histogram_family(catalogue.XLA_STEP_DURATION, labels, state.step_duration)
        yield histogram_family(catalogue.XLA_GRAPHS_PER_STEP, labels, state.graphs_per_step)
        yield single_series(catalogue.XLA_FRAGMENTED_STEPS, labels, state.fragmented_steps)
        yield single_series(catalogue.XLA_STEP_MARKERS, labels, state.markers)
        yield single_series(catalogue.SYNCS, labels, state.syncs)
        yield single_series(catalogue.WARMUP_STEPS, labels, self.source.tracker.warmup_steps)

    def _site_families(self, labels: dict[str, str]) -> Iterator[Metric]:
        records = self.source.attribution.records()
        for family in SITE_FAMILIES:
            values = [(key, value) for record in records for key, value in _site_values(family, record)]
            yield labelled_family(family, labels, values, {"location": self._site_budgets[family]})
        sites = [((site.op, site.location, site.pass_name), 1) for site in self.source.attribution.fallback_sites()]
        budgets = {"op": self._fallback_budget, "location": self._site_budgets[FALLBACK_SITES]}
        yield labelled_family(FALLBACK_SITES, labels, sites, budgets)

    def _xla_families(self, labels: dict[str, str]) -> Iterator[Metric]:
        snapshot = self._totals.read(self.source.reader.snapshot)
        yield from snapshot_families(snapshot, labels, self._fallback_budget, self._lowered_budget)


FALLBACK_SITES = catalogue.XLA_FALLBACK_SITES
SITE_FAMILIES = (
    catalogue.XLA_GRAPH_CUTS,
    catalogue.XLA_HOST_READS,
    catalogue.XLA_NEW_GRAPHS,
    catalogue.XLA_RECOMPILATIONS,
)


def _site_values(family: Family, record: SiteRecord):
    """((label values, the location last), value) of one site's record for one family."""
    if family is catalogue.XLA_GRAPH_CUTS:
        return [((cause, record.location), count) for cause, count in record.cuts.items()]
    if family is catalogue.XLA_HOST_READS:
        return [((cause, record.location), count) for cause, count in record.causes.items()]
    count = record.new_graphs if family is catalogue.XLA_NEW_GRAPHS else record.recompilations
    return [((record.location,), count)] if count else []
