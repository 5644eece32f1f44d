"""The node endpoint: every rank of the machine on one ``/metrics``, with each rank's liveness and host metrics.

A rank is *running* while its process lives and steps, *hung* when the process lives but has made no step
(or, before its first step, written no report) for ``hung_after_seconds``, *dead* when its process is gone.
Hung and dead ranks keep their last values (counters never drop to 0) until their file is
``expire_after_seconds`` old. A rank that finished cleanly keeps its values too, without liveness series.
"""

from __future__ import annotations

import errno
import logging
import platform
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client import ProcessCollector
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest

from .. import __version__
from .. import diagnosis
from ..config import Options
from .host_metrics import HostCollector
from .spool import (
    RankMeta, RejectedFile, SpoolDirError, check_spool_dir, is_expired, rank_order, read_diagnosis, read_rank_files,
    remove_rank_files, remove_stale_temp_files, writer_alive)

log = logging.getLogger(__name__)

STATES = ("running", "hung", "dead")
REJECT_REASONS = ("not_regular", "too_large", "bad_header", "wrong_rank", "bad_exposition", "unreadable")
MAX_LOGGED_REJECTIONS = 100


@dataclass(frozen=True)
class RankStatus:
    meta: RankMeta
    state: str | None  # one of STATES; None for a rank that finished cleanly (no liveness series)
    last_report: float  # unix time of the rank's last step, or of its last report before its first step
    exposition: bytes


def merge_expositions(expositions: Iterable[bytes]) -> bytes:
    """One exposition from several (text format 0.0.4, as prometheus_client writes it): each family once,
    with its HELP and TYPE from the first exposition that has it and the samples of all of them."""
    families: dict[bytes, list] = {}
    for text in expositions:
        if not text:
            continue
        for chunk in (b"\n" + text).split(b"\n# HELP ")[1:]:
            help_line, _, body = chunk.partition(b"\n")
            type_line = None
            if body.startswith(b"# TYPE "):
                type_line, _, body = body.partition(b"\n")
            name = help_line.split(b" ", 1)[0]
            family = families.get(name)
            if family is None:
                families[name] = family = [help_line, type_line, []]
            elif family[1] is None:
                family[1] = type_line
            body = body.strip(b"\n")
            if body:
                family[2].append(body)
    out = []
    for name, (help_line, type_line, bodies) in families.items():
        out.append(b"# HELP " + help_line)
        if type_line is not None:
            out.append(type_line)
        out.extend(bodies)
    return b"\n".join(out) + b"\n" if out else b""


class NodeView:
    """Renders the node endpoint from the spool directory (and the serving process's own exposition)."""

    def __init__(self, options: Options, run_id: str | None = None):
        """``run_id``: serve that run only (a training rank's own endpoint); None: every run (the daemon)."""
        self.options = options
        self.run_id = run_id
        self._host = HostCollector()
        self._process = ProcessCollector(registry=None)
        self._logged: set[tuple[str, str]] = set()
        self.rejected: list[tuple[str, RejectedFile]] = []  # of the last statuses(): files left out, and why
        self.spool_dir_ok = True

    def statuses(self, own: tuple[RankMeta | Mapping, bytes] | None = None, now: float | None = None,
                 own_idle: bool = False) -> list[RankStatus]:
        """Every rank the endpoint serves, with its state; deletes the files of dead ranks past the expiry.
        ``own_idle``: the serving process has not trained, so another process that reports its rank (the worker a
        launcher started) is shown instead of it."""
        now = time.time() if now is None else now
        statuses = []
        own_meta = RankMeta.of(own[0]) if own is not None else None
        rejected: list[tuple[str, RejectedFile]] = []
        for report in self._spool_reports(rejected, now):
            alive = writer_alive(report)
            if self.run_id is not None and report.meta.run_id != self.run_id:
                continue
            if own_meta is not None and (report.meta.run_id, report.meta.rank) == (own_meta.run_id, own_meta.rank):
                if not (own_idle and report.meta.pid != own_meta.pid):
                    continue  # the live process's own exposition is newer than its file
                own_meta = None
            if is_expired(report, self.options.expire_after_seconds, now):
                if alive is False:
                    remove_rank_files(report)
                continue
            statuses.append(self._status(report.meta, report.exposition, alive, report.mtime, now))
        if own_meta is not None:
            statuses.append(self._status(own_meta, own[1], alive=True, written=now, now=now))
        self.rejected = rejected
        return sorted(statuses, key=lambda s: (s.meta.run_id, rank_order(s.meta.rank)))

    def _spool_reports(self, rejected: list, now: float):
        directory = self.options.spool_dir
        try:
            check_spool_dir(directory, self.options.spool_mode, writer=False)
        except SpoolDirError as error:
            self.spool_dir_ok = error.errno == errno.ENOENT  # no directory yet (no job has started) is no problem
            if not self.spool_dir_ok:
                self._log_once("", "spool_dir", str(error))
            return []
        self.spool_dir_ok = True
        remove_stale_temp_files(directory, now)
        reports = read_rank_files(directory, self.options.spool_max_file_bytes, rejected)
        for name, error in rejected:
            self._log_once(name, error.reason, f"{name}: {error}")
        return reports

    def _log_once(self, name: str, reason: str, message: str) -> None:
        if (name, reason) not in self._logged and len(self._logged) < MAX_LOGGED_REJECTIONS:
            self._logged.add((name, reason))
            log.warning("neuron-exporter: not serving from the spool directory: %s", message)

    def _status(self, meta: RankMeta, exposition: bytes, alive: bool | None, written: float,
                now: float) -> RankStatus:
        progress = meta.last_step_time if meta.last_step_time is not None else written
        if meta.finished:
            state = None
        elif alive is False:
            state = "dead"
        elif now - progress > self.options.hung_after_seconds:
            state = "hung"
        else:
            state = "running"
        return RankStatus(meta, state, progress, exposition)

    def diagnosis(self, own: dict | None = None) -> dict:
        """The diagnosis document of every rank the endpoint serves (``own``: the serving process's, if it trains).
        A rank file's diagnosis that is not a diagnosis is left out, like a bad rank file."""
        documents = [own] if own is not None else []
        own_ranks = {(str(r.get("run_id")), str(r.get("rank"))) for r in own.get("ranks", [])} if own else set()
        now = time.time()
        for report in read_rank_files(self.options.spool_dir, self.options.spool_max_file_bytes):
            if (report.meta.run_id, report.meta.rank) in own_ranks or (
                    self.run_id is not None and report.meta.run_id != self.run_id) or is_expired(
                    report, self.options.expire_after_seconds, now):
                continue
            data = read_diagnosis(report, diagnosis.MAX_BYTES)
            if data is None:
                continue
            try:
                document = diagnosis.loads(data, report.path.name)
            except diagnosis.DiagnosisError as error:
                self._log_once(report.path.name, "bad_diagnosis", str(error))
                continue
            # A rank file speaks only for its own rank.
            documents.append({"ranks": [r for r in document["ranks"] if (str(r.get("run_id")), str(r.get("rank")))
                                        == (report.meta.run_id, report.meta.rank)]})
        return diagnosis.merge(documents)

    def render(self, own: tuple[RankMeta | Mapping, bytes] | None = None, own_idle: bool = False) -> bytes:
        """The node endpoint's exposition. ``own`` is ``(meta, exposition)`` of the process serving it."""
        statuses = self.statuses(own, own_idle=own_idle)
        # Without a rank of its own, the serving process is a daemon (serve, run): it shows its own version and
        # process_* metrics (a rank's are xla_process_*, and a rank file may hold no process_* family).
        daemon = self._process if own is None else None
        node = generate_latest(_NodeMetrics(statuses, self._host, self.rejected, self.spool_dir_ok, daemon))
        return merge_expositions([s.exposition for s in statuses] + [node])


class _NodeMetrics:
    """The endpoint's own families, as a collector for ``generate_latest``."""

    def __init__(self, statuses: list[RankStatus], host: HostCollector, rejected: list[tuple[str, RejectedFile]],
                 spool_dir_ok: bool, daemon: ProcessCollector | None = None):
        self.statuses = statuses
        self.host = host
        self.rejected = rejected
        self.spool_dir_ok = spool_dir_ok
        self.daemon = daemon

    def collect(self) -> Iterator[Metric]:
        labels = ["run_id", "rank", "local_rank"]
        up = GaugeMetricFamily("neuron_exporter_rank_up",
                               "1 if the rank is running, 0 if it is hung or dead", labels=labels)
        state = GaugeMetricFamily("neuron_exporter_rank_state",
                                  "The rank's state: 1 for the current one of running, hung, dead",
                                  labels=labels + ["state"])
        last = GaugeMetricFamily("neuron_exporter_rank_last_report_timestamp_seconds",
                                 "When the rank last reported progress (unix time)", labels=labels)
        for status in self.statuses:
            ids = [status.meta.run_id, status.meta.rank, status.meta.local_rank]
            last.add_metric(ids, status.last_report)
            if status.state is None:
                continue
            up.add_metric(ids, 1.0 if status.state == "running" else 0.0)
            for name in STATES:
                state.add_metric(ids + [name], 1.0 if status.state == name else 0.0)
        yield up
        yield state
        yield last
        yield GaugeMetricFamily("neuron_exporter_ranks", "Ranks the node endpoint knows (running, hung or dead)",
                                value=len(self.statuses))
        bad = GaugeMetricFamily("neuron_exporter_spool_rejected_files",
                                "Files in the spool directory that are not served, by reason (see the log)",
                                labels=["reason"])
        for reason in REJECT_REASONS:
            bad.add_metric([reason], sum(1 for _, error in self.rejected if error.reason == reason))
        yield bad
        yield GaugeMetricFamily("neuron_exporter_spool_directory_ok",
                                "0 if the spool directory is unsafe to read (see the log), else 1 (also before it "
                                "exists)",
                                value=1.0 if self.spool_dir_ok else 0.0)
        yield from self.host.collect()
        if self.daemon is not None:  # no rank labels: the ranks' build_info series carry theirs
            info = GaugeMetricFamily("neuron_exporter_build_info", "Versions of the exporter and of what it runs with",
                                     labels=["version", "python_version"])
            info.add_metric([__version__, platform.python_version()], 1)
            yield info
            yield from self.daemon.collect()
