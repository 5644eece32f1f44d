"""Where and why: host reads, graph cuts and compilations by site, and what changed at a recompilation.

Fed by the host-read and upload wrappers (``host_reads``) and by the step hook at every step marker. Pure
bookkeeping under one lock; every table is bounded, so user code cannot grow it without end.

A *computation* is named by its site, the sites of the graphs that ran before it since the last step marker (the
graph a marker runs after a logging ``.item()`` cut is another one than the one it runs in other steps), and its
traits: its size in IR nodes (torch_xla's ``TensorsGraphSize``) and the inputs whose buffers its outputs reuse
(``InputOutputAliasCount``). A site that runs different code (the first step that also builds the optimizer's
state, an eval pass, a logging step, ``correct += ...`` from 0 then from a tensor) runs graphs with other traits.
Another Python value baked into the graph (``x[:, :n]``) changes neither trait; other input shapes keep the aliases
but may move the size by a node or two (a batch of 8 and one of 9 lower differently).

So a compilation is a *recompilation* when uploads changed shape since an earlier compilation of the same computation
(the same traits, or the same aliases at the site's last compilation; or the same traits elsewhere, as when a
logging step ends the usual step at another line), or when the same computation compiles a third time or more with
no upload changed (a Python value that keeps changing: a single repeat is what the first steps of a process do as it
settles, and cannot be told from one). Any other compilation is a *new graph*, whenever it happens: neither depends
on when a step logs. At a recompilation the uploads whose shapes changed are named, old -> new; if none did, a Python
value baked into the graph changed.
"""

from __future__ import annotations

import logging
import os
from collections import deque
from dataclasses import dataclass, field

from .. import fork_safe
from ..label_values import CPU_FALLBACK, SYNC_TENSORS, UNATTRIBUTED
from .sites import UNKNOWN

log = logging.getLogger("neuron_exporter")

MAX_SITES = 1000  # distinct sites remembered (the metrics' label budget is separate and smaller)
MAX_GRAPHS = 4000  # distinct graphs remembered
MAX_VARIANTS = 8  # traits remembered per site and sites before it
MAX_UPLOAD_SITES = 200
MAX_PRIOR = 8  # earlier graph sites in one step that name a graph
MAX_CHANGES = 5  # shape changes kept per site for the detailed view
# SYNC_TENSORS: torch_xla's partial sync of chosen tensors (xm.mesh_reduce and xm.save before they copy to the host,
# xm.unlazy, torch_xla.utils.serialization, the dynamo bridge before it runs a compiled graph): it runs their graph
# there, a cut, with no Tensor method in between. Counted as a cut of this cause, not as a host read.


@dataclass
class SiteRecord:
    """What happened at one site (one source line), for the metrics and the detailed view."""

    location: str
    causes: dict[str, int] = field(default_factory=dict)  # host reads by cause
    cuts: dict[str, int] = field(default_factory=dict)  # graphs cut, by cause
    new_graphs: int = 0
    recompilations: int = 0
    frames: list[str] = field(default_factory=list)  # the last user frames seen here, innermost first
    changes: deque = field(default_factory=lambda: deque(maxlen=MAX_CHANGES))  # recent recompilations' causes

    def as_dict(self) -> dict:
        return {
            "location": self.location,
            "host_reads": dict(self.causes),
            "graph_cuts": dict(self.cuts),
            "new_graphs": self.new_graphs,
            "recompilations": self.recompilations,
            "frames": list(self.frames),
            "recompilation_causes": list(self.changes),
        }


@dataclass
class Variant:
    """A computation's compilations at one site with the same traits."""

    uploads: dict[str, tuple] = field(default_factory=dict)  # upload shapes at the last compilation
    compiles: int = 0


@dataclass
class FallbackSite:
    """Where a CPU-fallback operator was called, as the fallback probe saw it."""

    op: str
    location: str
    frames: list[str]
    backward: bool  # called from the backward pass: the location is the line that called backward()

    @property
    def pass_name(self) -> str:
        return "backward" if self.backward else "forward"

    def as_dict(self) -> dict:
        return {"op": self.op, "location": self.location, "frames": list(self.frames), "pass": self.pass_name}


class Attribution:
    def __init__(self):
        self._lock = fork_safe.Lock()
        self.sites: dict[str, SiteRecord] = {}
        self._compiled: dict[tuple, dict[tuple, Variant]] = {}  # (site, sites before it) -> {traits: variant}
        self._by_traits: dict[tuple, dict[str, tuple]] = {}  # traits -> upload shapes at their last compilation
        self._uploads: dict[str, tuple] = {}  # upload site -> the shapes it sent last
        self._prior: list[str] = []  # sites of the graphs run since the last step marker
        self._attributed_cuts = 0  # graphs run by host reads since the last step marker
        self._attributed_compiles = 0
        self._fallbacks_seen = 0  # CPU-fallback executions at the last marker that cut graphs
        self.probing = False  # a step watched by the fallback probe: its compilations are the probe's, not the job's
        self._fallback_sites: dict[tuple[str, str], FallbackSite] = {}  # (operator, location) -> where it was called

    def _site(self, location: str, frames=None) -> SiteRecord:
        record = self.sites.get(location)
        if record is None:
            if len(self.sites) >= MAX_SITES:
                location = "other"
                record = self.sites.setdefault(location, SiteRecord(location))
            else:
                record = self.sites[location] = SiteRecord(location)
                log.info("neuron-exporter: new site %s", location)
        if frames:
            record.frames = frames
        return record

    # -- events ---------------------------------------------------------------------------------------------
    def host_read(
        self, cause: str, location: str, frames, graphs: int = 0, compiles: int = 0, traits: tuple = ((), ())
    ) -> None:
        """A host read of device data at ``location``. On a lazy device (XLA) it ran ``graphs`` graphs and ``compiles``
        compilations, and ``traits`` are (sizes, aliases) of those (``XlaReader.graph_traits``); on an eager device,
        none."""
        with self._lock:
            record = self._site(location, frames)
            if cause != SYNC_TENSORS:  # a sync of chosen tensors cuts the graph but reads nothing
                record.causes[cause] = record.causes.get(cause, 0) + 1
            if graphs:
                record.cuts[cause] = record.cuts.get(cause, 0) + graphs
                self._attributed_cuts += graphs
                self._compile(location, compiles, traits)
                self._attributed_compiles += compiles
                if len(self._prior) < MAX_PRIOR:
                    self._prior.append(location)

    def fallback_site(self, op: str, location: str, frames: list[str], backward: bool) -> None:
        """The fallback probe saw ``op`` called at ``location`` (any thread)."""
        with self._lock:
            if (op, location) in self._fallback_sites or len(self._fallback_sites) < MAX_SITES:
                self._fallback_sites[(op, location)] = FallbackSite(op, location, frames, backward)

    def fallback_sites(self) -> list[FallbackSite]:
        with self._lock:
            return list(self._fallback_sites.values())

    def upload(self, location: str, shapes: tuple) -> None:
        """Host data sent to the device from ``location``, with these shapes."""
        with self._lock:
            if location in self._uploads or len(self._uploads) < MAX_UPLOAD_SITES:
                # The distinct shapes: a parallel loader sends a varying number of batches of the same shapes at once.
                self._uploads[location] = tuple(sorted(set(shapes)))

    def step_marker(
        self, cuts: int, compiles_before: int, graphs_at_marker: int, compiles_at_marker: int, extra: tuple | None
    ) -> None:
        """A step marker that found ``cuts`` graphs and ``compiles_before`` compilations since the previous one and
        ran ``graphs_at_marker`` graphs and ``compiles_at_marker`` compilations itself. ``extra`` is what the marker's
        hook saw: ((site, frames) of the marker if it compiled, else None; CPU-fallback executions so far if graphs
        were cut, else None; the traits of the graphs run since the last marker or host read if one compiled)."""
        marker_site, fallbacks, (sizes, aliases) = extra or (None, None, ((), ()))
        split = max(0, len(sizes) - graphs_at_marker)
        split_aliases = max(0, len(aliases) - compiles_at_marker)
        with self._lock:
            unattributed = cuts - self._attributed_cuts
            if unattributed > 0:
                fallback_ran = fallbacks is not None and fallbacks > self._fallbacks_seen
                cause = CPU_FALLBACK if fallback_ran else UNATTRIBUTED
                record = self._site(UNKNOWN)
                record.cuts[cause] = record.cuts.get(cause, 0) + unattributed
                self._compile(
                    UNKNOWN,
                    max(0, compiles_before - self._attributed_compiles),
                    (sizes[:split], aliases[:split_aliases]),
                )
                if len(self._prior) < MAX_PRIOR:
                    self._prior.append(UNKNOWN)
            if fallbacks is not None:
                self._fallbacks_seen = max(self._fallbacks_seen, fallbacks)
            if compiles_at_marker:
                location, frames = marker_site or (UNKNOWN, [])
                self._site(location, frames)
                self._compile(location, compiles_at_marker, (sizes[split:], aliases[split_aliases:]))
            self._prior.clear()
            self._attributed_cuts = self._attributed_compiles = 0

    def _compile(self, location: str, compiles: int, traits: tuple) -> None:
        if not compiles or self.probing:
            return
        graph = (location, *self._prior)
        record = self._site(location)
        variants = self._compiled.get(graph)
        if variants is None:
            if len(self._compiled) >= MAX_GRAPHS:
                record.new_graphs += compiles
                return
            variants = self._compiled[graph] = {}
        earlier = self._same_computation(variants, traits)
        if earlier is None:
            record.new_graphs += compiles
        else:
            record.recompilations += compiles
            record.changes.append(self._what_changed(earlier.uploads))
        variant = variants.pop(traits, None) or Variant()
        variant.uploads, variant.compiles = dict(self._uploads), variant.compiles + compiles
        variants[traits] = variant  # the last compiled last
        if len(variants) > MAX_VARIANTS:
            del variants[next(iter(variants))]
        if traits in self._by_traits or len(self._by_traits) < MAX_GRAPHS:
            self._by_traits[traits] = variant.uploads

    def _same_computation(self, variants: dict[tuple, Variant], traits: tuple) -> Variant | None:
        """The earlier compilation of this computation that this one recompiles, None if it is a new graph."""
        same = variants.get(traits)
        if same is not None and (self._shapes_changed(same.uploads) or same.compiles >= 2):
            return same
        if variants:
            last = next(reversed(variants))
            if last[1] == traits[1] and self._shapes_changed(variants[last].uploads):
                return variants[last]
        elsewhere = self._by_traits.get(traits) if traits[0] else None
        if elsewhere is not None and self._shapes_changed(elsewhere):
            return Variant(elsewhere)
        return None

    def _shapes_changed(self, before: dict[str, tuple]) -> bool:
        return any(site in before and before[site] != shapes for site, shapes in self._uploads.items())

    def _what_changed(self, before: dict[str, tuple]) -> dict:
        changed = {
            site: {"before": _shown(before.get(site)), "now": _shown(shapes)}
            for site, shapes in self._uploads.items()
            if site in before and before[site] != shapes
        }
        if not changed:
            return {
                "uploads": {},
                "cause": "the graph changed without any upload changing shape: a Python value "
                "baked into the graph (x[:, :n])",
            }
        return {"uploads": changed, "cause": "uploads changed shape"}

    # -- reading --------------------------------------------------------------------------------------------
    def diagnosis(self, labels: dict[str, str], steps: int, fallback_ops: dict[str, int]) -> dict:
        """This rank's part of the diagnosis document (see ``neuron_exporter.diagnosis``)."""
        records = self.records()
        return {
            **labels,
            "pid": os.getpid(),
            "steps": steps,
            "graph_cuts": sum(sum(r.cuts.values()) for r in records),
            "new_graphs": sum(r.new_graphs for r in records),
            "recompilations": sum(r.recompilations for r in records),
            "cpu_fallback_ops": dict(fallback_ops),
            "cpu_fallback_sites": [site.as_dict() for site in self.fallback_sites()],
            "sites": [r.as_dict() for r in records],
        }

    def records(self) -> list[SiteRecord]:
        """A copy of every site's record, for a scrape or the detailed view."""
        with self._lock:
            return [
                SiteRecord(
                    r.location,
                    dict(r.causes),
                    dict(r.cuts),
                    r.new_graphs,
                    r.recompilations,
                    list(r.frames),
                    deque(r.changes, maxlen=MAX_CHANGES),
                )
                for r in self.sites.values()
            ]


def _shown(shapes: tuple | None) -> str | None:
    if shapes is None:
        return None
    return ", ".join(str(tuple(shape)) for shape in shapes)
