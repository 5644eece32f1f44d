"""The node endpoint: every rank of the machine on one ``/metrics``, with each rank's liveness and host metrics.

A rank is *running* while its process lives and steps, *hung* when the process lives but has made no step for
``hung_after_seconds`` (before its first step: since the endpoint first saw it, or since its last report), *dead*
when its process is gone. A process writes the spool from its first step (or compilation); the endpoint it serves
shows it before that too, unless another process reports its rank (the worker a launcher started).
Hung and dead ranks keep their last values (counters never drop to 0) until their file is
``expire_after_seconds`` old. A rank that finished cleanly keeps its values too, without liveness series.
Both ages are judged on the endpoint's own clocks as well (``seen_times``): a time ahead of now (a clock set back)
neither keeps a dead rank served nor a rank that stopped stepping running; nor is a last step taken as later than
its file was written.
"""

from __future__ import annotations

import errno
import logging
import os
import platform
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import ProcessCollector
from prometheus_client.core import Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.utils import floatToGoString

from .. import __version__, catalogue, diagnosis
from ..config import Options
from ..config_file import printable
from ..metric_family import labelled_family, single_series
from .exposition_check import escape_label_value
from .host_metrics import HostCollector
from .seen_times import SeenTimes
from .spool_dir import Spool, SpoolDirError
from .spool_expiry import is_expired
from .spool_format import DIAGNOSIS_SUFFIX, RankMeta, RankReport, RejectedFile
from .spool_reader import Refresh, SpoolReader, read_diagnosis, writer_alive

log = logging.getLogger(__name__)

STATES = RUNNING, HUNG, DEAD = catalogue.RANK_STATE.values_of("state")
REJECT_REASONS = (
    "not_regular",
    "too_large",
    "bad_header",
    "wrong_rank",
    "bad_exposition",
    "unreadable",
    "over_budget",
    "untrusted_owner",
)
MAX_LOGGED_REJECTIONS = 100
READ_INTERVAL_SECONDS = 0.25  # with start_reading(): how often changed files are checked
IDLE_SECONDS = 600.0  # with start_reading(): no scrape for this long, no checking
NOTE_BYTES = 400  # room on the /diagnosis page for the note of a rank left out


@dataclass(frozen=True)
class RankStatus:
    meta: RankMeta
    state: str | None  # one of STATES; None for a rank that finished cleanly (no liveness series)
    last_report: float  # unix time of the rank's last step; before its first step, of when the endpoint first saw it
    exposition: bytes
    path: Path | None = None  # the rank file it was read from; None for the serving process's own


TextFamily = tuple[bytes, bytes, "bytes | None", bytes]  # name, HELP line (without "# HELP "), TYPE line, samples


def split_families(text: bytes) -> list[TextFamily]:
    """The families of an exposition (text format 0.0.4, as prometheus_client writes it), in order."""
    families = []
    for chunk in (b"\n" + text).split(b"\n# HELP ")[1:]:
        help_line, _, body = chunk.partition(b"\n")
        type_line = None
        if body.startswith(b"# TYPE "):
            type_line, _, body = body.partition(b"\n")
        families.append((help_line.split(b" ", 1)[0], help_line, type_line, body.strip(b"\n")))
    return families


def merge_families(expositions: Iterable[list[TextFamily]]) -> bytes:
    """One exposition from several split ones: each family once, with its HELP and TYPE from the first exposition
    that has it and the samples of all of them."""
    families: dict[bytes, list] = {}
    for split in expositions:
        for name, help_line, type_line, body in split:
            family = families.get(name)
            if family is None:
                families[name] = family = [help_line, type_line, []]
            elif family[1] is None:
                family[1] = type_line
            if body:
                family[2].append(body)
    out = []
    for help_line, type_line, bodies in families.values():
        out.append(b"# HELP " + help_line)
        if type_line is not None:
            out.append(type_line)
        out.extend(bodies)
    return b"\n".join(out) + b"\n" if out else b""


class NodeView:
    """Renders the node endpoint from the spool directory (and, in a training job's endpoint, the exposition of the
    process that started it)."""

    def __init__(self, options: Options, spool: Spool | None = None, run_id: str | None = None):
        """``spool``: the spool directory to read, which the commands build once and hand down (None, for tests:
        ``Spool.of(options)``). ``run_id``: serve that run only, and read no other run's files (a training job's
        endpoint); None: every run (the daemon)."""
        self.options = options
        self.spool = Spool.of(options) if spool is None else spool
        self.run_id = run_id
        self._reader = SpoolReader(
            self.spool,
            options.spool_max_file_bytes,
            options.spool_max_total_bytes,
            options.spool_max_files,
            run_id,
        )
        self._split: dict[Path, tuple[bytes, list[TextFamily]]] = {}  # rank file -> (exposition, its families)
        self._host = HostCollector()
        self._process = ProcessCollector(registry=None)
        self._logged: set[tuple[str, str]] = set()
        self._budget_logged = False
        self.rejected: list[tuple[str, RejectedFile]] = []  # of the last refresh: files left out, and why (the first)
        self.rejected_counts: dict[str, int] = {}  # of the last refresh: files left out, by reason
        self._progress = SeenTimes()  # of each rank's process: when its last step time was last seen to change
        self._written = SeenTimes()  # of each rank file: when it was last seen to change
        self.spool_dir_ok = True
        self._reading: threading.Thread | None = None
        self._last_scrape = float("-inf")  # monotonic

    def start_reading(self) -> NodeView:
        """Check changed rank files on a thread of their own, so that scrapes send what was already checked. While
        nobody scrapes (``IDLE_SECONDS``), nothing is read; the first scrape after that reads what changed itself."""
        if self._reading is None:
            self._reading = threading.Thread(
                target=self._read_changed_files, name="neuron-exporter-spool-reader", daemon=True
            )
            self._reading.start()
        return self

    def _read_changed_files(self) -> None:
        while True:
            time.sleep(READ_INTERVAL_SECONDS)
            if time.monotonic() - self._last_scrape < IDLE_SECONDS:
                try:
                    self._reader.read_changed_files()
                except Exception as error:  # noqa: BLE001 (the scrape path reads what this could not)
                    self._log_once("", "reader", f"reading the spool directory failed: {error}")

    def statuses(
        self, own: tuple[RankMeta | Mapping, bytes] | None = None, now: float | None = None, own_idle: bool = False
    ) -> list[RankStatus]:
        """Every rank the endpoint serves, with its state (a rank past the expiry is left out).
        ``own_idle``: the serving process has not claimed its rank (no step, no compilation): another process that
        reports its rank (the worker a launcher started) is shown instead of it. Shown, it is hung once
        ``hung_after_seconds`` have passed since it was first seen without a step (stuck in a first collective or
        compilation), and its exporter's own series (errors, process) are served meanwhile."""
        now = time.time() if now is None else now
        statuses = []
        own_meta, own_exposition = (RankMeta.of(own[0]), own[1]) if own is not None else (None, b"")
        for report in self._refresh().reports:
            alive = writer_alive(report, self.spool.file_owners)
            if self.run_id is not None and report.meta.run_id != self.run_id:
                continue
            if own_meta is not None and (report.meta.run_id, report.meta.rank) == (own_meta.run_id, own_meta.rank):
                if not (own_idle and report.meta.pid != own_meta.pid):
                    continue  # the live process's own exposition is newer than its file
                own_meta = None
            if is_expired(report, self.options.expire_after_seconds, self._written, now):
                continue  # its files are removed by spool_expiry
            statuses.append(self._status(report.meta, report.exposition, alive, report.mtime, now, report.path))
        if own_meta is not None:
            statuses.append(self._status(own_meta, own_exposition, alive=True, written=now, now=now))
        self._progress.keep_only(_identity(s.meta) for s in statuses)
        return sorted(statuses, key=lambda s: (s.meta.run_id, diagnosis.rank_order(s.meta.rank)))

    def check_directory(self) -> bool:
        """Whether the spool directory is safe to read (``spool_dir_ok``); the reason it is not is logged once."""
        try:
            self.spool.check()
        except SpoolDirError as error:
            self.spool_dir_ok = error.errno == errno.ENOENT  # no directory yet (no job has started) is no problem
            if not self.spool_dir_ok:
                self._log_once("", "spool_dir", str(error))
            return False
        self.spool_dir_ok = True
        return True

    def _refresh(self) -> Refresh:
        """The spool read (``SpoolReader.refresh``); what it left out is kept for the render (``rejected``)."""
        if not self.check_directory():
            self.rejected, self.rejected_counts = [], {}
            self._written.keep_only(())
            return Refresh([], [], {}, {})
        scraped, self._last_scrape = self._last_scrape, time.monotonic()
        background = self._reading is not None and self._last_scrape - scraped < IDLE_SECONDS
        refresh = self._reader.refresh(read_changed=not background)
        self.rejected, self.rejected_counts = refresh.rejected, refresh.rejected_counts
        self._written.keep_only(report.path for report in refresh.reports)
        for name, rejection in self.rejected:
            if rejection.reason != "over_budget":
                self._log_once(name, rejection.reason, f"{printable(name, 300)}: {rejection}")  # any name
        over_budget = self.rejected_counts.get("over_budget", 0)
        if over_budget and not self._budget_logged:
            self._budget_logged = True
            log.warning(
                "neuron-exporter: not serving %d files of the spool directory %s: it holds more than the %d "
                "files or %d bytes the endpoint reads (spool_max_files, spool_max_total_bytes); "
                'neuron_exporter_spool_rejected_files{reason="over_budget"} counts them',
                over_budget,
                self.spool.directory,
                self.options.spool_max_files,
                self.options.spool_max_total_bytes,
            )
        return refresh

    def _log_once(self, name: str, reason: str, message: str) -> None:
        if (name, reason) not in self._logged and len(self._logged) < MAX_LOGGED_REJECTIONS:
            self._logged.add((name, reason))
            log.warning("neuron-exporter: not serving from the spool directory: %s", message)

    def _status(
        self,
        meta: RankMeta,
        exposition: bytes,
        alive: bool | None,
        written: float,
        now: float,
        path: Path | None = None,
    ) -> RankStatus:
        """A rank's state. Before its first step, a rank is judged from when the endpoint first saw it, or from its
        last report if that is older: a new report alone says nothing (the rank's spool thread writes one every
        couple of seconds, whatever its training does). Its last step is judged by when the endpoint last saw it
        change, too: a step time ahead of now is not progress. Nor is a step later than the report that tells of it
        was written (a clock set back since): a rank first seen long after it stopped is judged from its report."""
        step = meta.last_step_time
        stamp = written if step is None else min(step, written)
        progress, stalled = self._progress.age(_identity(meta), step, stamp, now)
        if meta.finished:
            state = None
        elif alive is False:
            state = DEAD
        elif stalled > self.options.hung_after_seconds:
            state = HUNG
        else:
            state = RUNNING
        return RankStatus(meta, state, progress, exposition, path)

    def diagnosis(self, own: dict | None = None) -> dict:
        """The diagnosis document of every rank the endpoint serves (``own``: the serving process's, if it trains),
        within ``diagnosis.MAX_PAGE_BYTES`` as JSON: the ranks it cannot hold, or whose files are past the spool's
        budget, are listed with a note saying so. A rank file's diagnosis that is not a diagnosis is left out, like a
        bad rank file."""
        documents = [own] if own is not None else []
        own_ranks = {(str(r.get("run_id")), str(r.get("rank"))) for r in own.get("ranks", [])} if own else set()
        now = time.time()
        refresh = self._refresh()
        reports = [
            report
            for report in refresh.reports
            if (report.meta.run_id, report.meta.rank) not in own_ranks
            and (self.run_id is None or report.meta.run_id == self.run_id)
            and not is_expired(report, self.options.expire_after_seconds, self._written, now)
        ]
        within_budget = refresh.diagnoses
        room = diagnosis.MAX_PAGE_BYTES - NOTE_BYTES * len(reports) - sum(len(diagnosis.dumps(d)) for d in documents)
        left_out: list[tuple[RankMeta, str]] = []
        for report in reports:
            path = report.path.with_name(report.stem + DIAGNOSIS_SUFFIX)
            if path not in within_budget:
                if os.path.lexists(path):
                    left_out.append((report.meta, "left out: past the spool budget (spool_max_total_bytes)"))
                continue
            # A file larger than the room left is not even read (its JSON on the page is hardly shorter).
            part = self._rank_diagnosis(report) if within_budget[path] <= room else None
            size = len(diagnosis.dumps(part)) if part is not None else within_budget[path]
            if size > room:
                left_out.append((report.meta, f"left out: this page holds {diagnosis.MAX_PAGE_BYTES} bytes at most"))
            elif part is not None:
                room -= size
                documents.append(part)
        notes = [
            {"run_id": meta.run_id, "rank": meta.rank, "local_rank": meta.local_rank, "trimmed": note}
            for meta, note in left_out
        ]
        return diagnosis.merge([*documents, {"ranks": notes}])

    def _rank_diagnosis(self, report: RankReport) -> dict | None:
        """The diagnosis of ``report``'s rank from its file; None if there is none, or it is not one (logged)."""
        try:
            data = read_diagnosis(report, diagnosis.MAX_BYTES, self.spool.file_owners)
        except RejectedFile as error:
            self._log_once(report.path.name, "bad_diagnosis", f"the diagnosis of {report.path.name}: {error}")
            return None
        if data is None:
            return None
        try:
            document = diagnosis.loads(data, report.path.name)
        except diagnosis.DiagnosisError as error:
            self._log_once(report.path.name, "bad_diagnosis", str(error))
            return None
        # A rank file speaks only for its own rank.
        ranks = document["ranks"]
        return {
            "ranks": [r for r in ranks if (r.get("run_id"), r.get("rank")) == (report.meta.run_id, report.meta.rank)]
        }

    def render(self, own: tuple[RankMeta | Mapping, bytes] | None = None, own_idle: bool = False) -> bytes:
        """The node endpoint's exposition. ``own`` is ``(meta, exposition)`` of the process serving it."""
        statuses = self.statuses(own, own_idle=own_idle)
        # Without a rank of its own, the serving process is a daemon (serve, run): it shows its own version and
        # process_* metrics (a rank's are training_process_*, and a rank file may hold no process_* family).
        daemon = self._process if own is None else None
        node = generate_latest(_NodeMetrics(statuses, self._host, self.rejected_counts, self.spool_dir_ok, daemon))
        split: dict[Path, tuple[bytes, list[TextFamily]]] = {}
        ranks = [self._families(status, split) for status in statuses]
        self._split = split  # the files served now: one that is gone is forgotten with its exposition
        return merge_families([*ranks, rank_families(statuses), split_families(node)])

    def _families(self, status: RankStatus, split: dict[Path, tuple[bytes, list[TextFamily]]]) -> list[TextFamily]:
        """A rank's families, split once per version of its file (kept in ``split``)."""
        if status.path is None:
            return split_families(status.exposition)
        cached = self._split.get(status.path)
        if cached is None or cached[0] is not status.exposition:
            cached = (status.exposition, split_families(status.exposition))
        split[status.path] = cached
        return cached[1]


def _identity(meta: RankMeta) -> tuple:
    """A rank's process: a rank restarted in the same run is another."""
    return meta.run_id, meta.rank, meta.pid, meta.start_time


RANK_FAMILIES = tuple(
    (family.name.encode(), family.help.encode())
    for family in (catalogue.RANK_UP, catalogue.RANK_STATE, catalogue.RANK_LAST_REPORT)
)


def rank_families(statuses: list[RankStatus]) -> list[TextFamily]:
    """The liveness families, one series per rank, written as text: at 128 ranks a node, building them as
    prometheus_client families took most of a scrape. Rank labels are checked to need no escaping
    (spool_format.RANK_LABEL); the run's is escaped.
    """
    up: list[bytes] = []
    state: list[bytes] = []
    last: list[bytes] = []
    for status in statuses:
        meta = status.meta
        labels = f'run_id="{escape_label_value(meta.run_id)}",rank="{meta.rank}",local_rank="{meta.local_rank}"'
        last.append(
            f"neuron_exporter_rank_last_report_timestamp_seconds{{{labels}}} "
            f"{floatToGoString(status.last_report)}".encode()
        )
        if status.state is None:
            continue
        up.append(f"neuron_exporter_rank_up{{{labels}}} {'1.0' if status.state == 'running' else '0.0'}".encode())
        for name in STATES:
            state.append(
                f'neuron_exporter_rank_state{{{labels},state="{name}"}} '
                f"{'1.0' if status.state == name else '0.0'}".encode()
            )
    return [
        (name, name + b" " + help_text, b"# TYPE " + name + b" gauge", b"\n".join(lines))
        for (name, help_text), lines in zip(RANK_FAMILIES, (up, state, last), strict=True)
    ]


class _NodeMetrics:
    """The endpoint's own families, as a collector for ``generate_latest``."""

    def __init__(
        self,
        statuses: list[RankStatus],
        host: HostCollector,
        rejected: dict[str, int],
        spool_dir_ok: bool,
        daemon: ProcessCollector | None = None,
    ):
        self.statuses = statuses
        self.host = host
        self.rejected = rejected
        self.spool_dir_ok = spool_dir_ok
        self.daemon = daemon

    def collect(self) -> Iterator[Metric]:
        yield single_series(catalogue.RANKS, {}, len(self.statuses))
        rejected = [((reason,), self.rejected.get(reason, 0)) for reason in REJECT_REASONS]
        yield labelled_family(catalogue.SPOOL_REJECTED, {}, rejected)
        yield single_series(catalogue.SPOOL_DIRECTORY_OK, {}, 1.0 if self.spool_dir_ok else 0.0)
        yield from self.host.collect()
        if self.daemon is not None:  # no rank labels: the ranks' build_info series carry theirs
            yield labelled_family(catalogue.DAEMON_BUILD_INFO, {}, [((__version__, platform.python_version()), 1)])
            yield from self.daemon.collect()
