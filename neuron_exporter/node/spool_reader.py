"""The node endpoint's reading of the spool directory: each rank file read and checked once per change, within a
budget.

A rank rewrites its file every ``spool_interval_seconds``; a scrape may come many times in between. The reader keeps
the last report of every file with the file's identity (inode, size, modification time): a file whose identity did not
change is not read again, and a rewrite that changed only values is checked by its values (``exposition_check``).
Rejections are remembered the same way, so a bad file costs one read per change, not one per scrape.

What one refresh may read is bounded: at most ``max_files`` rank files are served, and ``max_total_bytes`` in all,
the ranks' diagnosis files included. ``spool_listing`` says which files are looked at, and in what order: the
trusted users' first, then other users' live ranks, then the rest, live runs before finished ones, at most
``LOOKED_AT_PER_FILE`` times ``max_files`` of them. A file rejected without being read in full (not a regular file,
too large, another user's where not trusted, a bad header, named for another rank) takes nothing from the budget:
what others lay in a shared spool cannot use it up. The rank files come first, then, with what is left, their
diagnosis files in the same order; the rest are rejected as ``over_budget`` without being opened. With ``run_id``,
only that run's files are looked at (a training job's own endpoint): other runs' files are never opened. A file
name is only ever parsed, never trusted.

An endpoint with a background thread keeps the checking off the scrape path: a scrape (``refresh(read_changed=False)``)
serves the last checked version of a file that changed, and the thread (``read_changed_files``) reads the new one.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import stat
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import psutil

from ..diagnosis import MAX_BYTES as MAX_DIAGNOSIS_BYTES
from ..diagnosis import rank_order
from .exposition_check import ExpositionError, recheck
from .spool_dir import Spool, file_identity, open_regular
from .spool_format import (
    DATA_SUFFIX,
    DIAGNOSIS_SUFFIX,
    FORMAT_VERSION,
    LOCK_SUFFIX,
    MAX_HEADER_BYTES,
    RankMeta,
    RankReport,
    RejectedFile,
    file_stem,
)
from .spool_listing import Rejections, list_rank_files

DEFAULT_MAX_BYTES = 4 * 1024 * 1024  # of one rank file
LOOKED_AT_PER_FILE = 4  # files looked at in a refresh, for each one it may serve (max_files)


def read_rank_file(
    path, max_bytes: int = DEFAULT_MAX_BYTES, previous: RankReport | None = None, trusted: frozenset[int] | None = None
) -> RankReport | None:
    """The report in ``path``; None if it vanished; ``RejectedFile`` if it is not a rank file to serve.
    ``previous``, the last report read from the same path, lets a rewrite that changed only values be checked by
    its values."""
    path = Path(path)
    try:
        fd, info = open_regular(path, max_bytes, trusted)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as f:
        head = f.read(MAX_HEADER_BYTES + 1)  # a bad header or name costs no more than this
        if len(head) > max_bytes:
            raise RejectedFile("too_large", f"more than the {max_bytes} bytes allowed")
        meta = _header(head, path)
        if meta is None:
            return None
        rest = f.read(max_bytes + 1 - len(head))
    if len(head) + len(rest) > max_bytes:
        raise RejectedFile("too_large", f"more than the {max_bytes} bytes allowed")
    exposition = head.partition(b"\n")[2] + rest
    same_rank = previous is not None and (previous.meta.rank, previous.meta.local_rank, previous.meta.run_id) == (
        meta.rank,
        meta.local_rank,
        meta.run_id,
    )
    try:
        checked = recheck(
            exposition,
            previous.checked if previous is not None and same_rank else None,
            meta.rank,
            meta.local_rank,
            meta.run_id,
        )
    except ExpositionError as error:
        raise RejectedFile("bad_exposition", str(error)) from None
    return RankReport(meta, exposition, info.st_mtime, path, checked)


def _header(head: bytes, path: Path) -> RankMeta | None:
    """The header at the start of the rank file ``path``: None for a file of format 1 (written by an exporter from
    before run_id: not served, not an attack), ``RejectedFile`` if it is not a header or names another file."""
    header, newline, _ = head.partition(b"\n")
    if not newline:
        raise RejectedFile("bad_header", f"no header line of at most {MAX_HEADER_BYTES} bytes")
    try:
        fields = json.loads(header)
        if isinstance(fields, dict) and fields.get("format") == 1:
            return None
        if not isinstance(fields, dict) or fields.get("format") != FORMAT_VERSION or "run_id" not in fields:
            raise ValueError(f"not a rank file of format {FORMAT_VERSION}")
        meta = RankMeta.of(fields)
    except (ValueError, RecursionError) as error:
        raise RejectedFile("bad_header", f"header: {str(error)[:100]}") from None
    if file_stem(meta.rank, meta.run_id) + DATA_SUFFIX != path.name:
        raise RejectedFile("wrong_rank", f"the header says rank {meta.rank} of run {meta.run_id}")
    return meta


def read_diagnosis(report: RankReport, max_bytes: int, trusted: frozenset[int] | None = None) -> bytes | None:
    """The diagnosis file written with ``report`` (its bytes, unchecked), or None if there is none to read;
    ``RejectedFile`` if it is not one to read (too large, not a regular file, another user's)."""
    try:
        fd, _ = open_regular(report.path.with_name(report.stem + DIAGNOSIS_SUFFIX), max_bytes, trusted)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        return f.read(max_bytes + 1)


def writer_alive(report: RankReport, trusted: frozenset[int] | None = None) -> bool | None:
    """Whether the process that wrote ``report`` still runs: True, False, or None if it cannot be told."""
    return lock_holder_alive(report.lock_path, report.meta, trusted)


def lock_holder_alive(lock_path: Path, meta: RankMeta | None, trusted: frozenset[int] | None = None) -> bool | None:
    """Whether a live process holds the rank lock ``lock_path``: True, False, or None if it cannot be told. A lock
    file that is missing or owned by none of ``trusted`` proves nothing: the process of ``meta`` is looked up
    instead, if it is known."""
    with probing_lock(lock_path, meta, trusted) as alive:
        return alive


@contextlib.contextmanager
def probing_lock(
    lock_path: Path, meta: RankMeta | None, trusted: frozenset[int] | None = None
) -> Iterator[bool | None]:
    """``lock_holder_alive``, for the time of a ``with`` block: where it is False, this process holds the lock
    (shared) until the block ends, so no rank of that name starts meanwhile (``spool_writer`` then retries)."""
    if meta is not None and meta.pid == os.getpid() and abs(meta.start_time - _own_start_time()) < 0.01:
        yield True  # never probe our own lock: closing the probe would release it
        return
    try:
        fd: int | None = open_regular(lock_path, 0, trusted)[0]
    except (OSError, RejectedFile):
        fd = None
    if fd is None:
        yield _pid_alive(meta) if meta is not None else None
        return
    try:
        try:
            fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            alive: bool | None = False
        except OSError as exc:
            if exc.errno in (errno.EACCES, errno.EAGAIN):
                alive = True  # the writer holds its lock
            else:
                alive = _pid_alive(meta) if meta is not None else None
        yield alive
    finally:
        os.close(fd)  # and with it the lock


def read_header(path: Path, trusted: frozenset[int] | None = None) -> RankMeta | None:
    """The header of the rank file ``path`` alone (not its exposition); None if it cannot be read or is not one."""
    try:
        fd, _ = open_regular(path, 2**63, trusted)
    except (OSError, RejectedFile):
        return None
    with os.fdopen(fd, "rb") as f:
        line = f.read(MAX_HEADER_BYTES + 1).partition(b"\n")[0]
    try:
        fields = json.loads(line)
        return RankMeta.of(fields) if isinstance(fields, dict) and fields.get("format") == FORMAT_VERSION else None
    except (ValueError, RecursionError):
        return None


_own: dict[str, float] = {}  # pid, start_time


def _own_start_time() -> float:
    pid = os.getpid()
    if _own.get("pid") != pid:
        _own.update(pid=pid, start_time=psutil.Process(pid).create_time())
    return _own["start_time"]


def _pid_alive(meta: RankMeta) -> bool | None:
    """Fallback when the lock file cannot be read: the pid, with its start time so a reused pid does not count."""
    try:
        return abs(psutil.Process(meta.pid).create_time() - meta.start_time) < 1.0
    except psutil.NoSuchProcess:
        return False
    except (psutil.Error, OSError):
        return None


class Refresh(NamedTuple):
    """What one refresh found."""

    reports: list[RankReport]  # the good rank files, ordered by run and rank
    rejected: list[tuple[str, RejectedFile]]  # files left out, and why: the first spool_listing.MAX_NAMED_REJECTIONS
    rejected_counts: dict[str, int]  # every file left out, by reason
    diagnoses: dict[Path, int]  # the diagnosis files within the budget: their sizes


@dataclass
class _Entry:
    identity: tuple[int, int, int, int]
    report: RankReport | None  # None: the file was rejected (``rejection``) or vanished
    rejection: RejectedFile | None


class SpoolReader:
    def __init__(
        self, spool: Spool, max_file_bytes: int, max_total_bytes: int, max_files: int, run_id: str | None = None
    ):
        """Serves the files of ``spool.file_owners``, reading those of ``spool.trusted`` first."""
        self.directory = spool.directory
        self.trusted = spool.file_owners
        self.first = spool.trusted
        self.max_file_bytes = max_file_bytes
        self.max_total_bytes = max_total_bytes
        self.max_files = max_files
        # A run's files end with its part of the file name; the header, checked on reading, has the last word.
        self._suffix = DATA_SUFFIX if run_id is None else "." + file_stem("0", run_id).split(".", 1)[1] + DATA_SUFFIX
        self._entries: dict[str, _Entry] = {}
        self._lock = threading.Lock()
        self._over_budget = RejectedFile(
            "over_budget",
            f"the spool directory holds more than the {max_files} rank files or {max_total_bytes} bytes "
            "the endpoint reads",
        )

    def refresh(self, read_changed: bool = True) -> Refresh:
        """The reports of every good rank file and the files rejected (``Refresh``).
        ``read_changed=False``: a file that changed since it was served is served as it was (``read_changed_files``
        reads it); new files, and files that were rejected, are read now."""
        with self._lock:
            return self._refresh(read_changed)

    def _refresh(self, read_changed: bool) -> Refresh:
        rejections = Rejections(self._over_budget)
        listed = list_rank_files(
            self.directory,
            self._suffix,
            LOOKED_AT_PER_FILE * self.max_files,
            self.max_total_bytes // self.max_files,
            self.max_file_bytes,
            self.trusted,
            self.first,
            self._holds_lock,
            rejections,
        )
        reports: list[RankReport] = []
        entries: dict[str, _Entry] = {}
        budget = self.max_total_bytes
        for name, info in listed:
            if len(reports) >= self.max_files or info.st_size > budget:
                rejections.add(name, self._over_budget)
                continue
            entry = self._entries.get(name)
            identity = file_identity(info)
            if entry is None or (entry.identity != identity and (read_changed or entry.report is None)):
                entry = self._read(self.directory / name, identity, entry)
            entries[name] = entry
            if entry.report is not None:
                reports.append(entry.report)
                budget -= info.st_size
            elif entry.rejection is not None:
                rejections.add(name, entry.rejection)
                if entry.rejection.reason == "bad_exposition":
                    budget -= info.st_size  # read and checked in full
        self._entries = entries
        diagnoses = {}
        for report in reports:  # what the rank files left of the budget, in the same order
            path = report.path.with_name(report.stem + DIAGNOSIS_SUFFIX)
            try:
                info = os.lstat(path)
            except OSError:
                continue
            size = min(info.st_size, MAX_DIAGNOSIS_BYTES + 1)  # no more is read of a larger one
            if size > budget:
                rejections.add(path.name, self._over_budget)
                continue
            budget -= size
            diagnoses[path] = size
        reports.sort(key=lambda r: (r.meta.run_id, rank_order(r.meta.rank)))
        return Refresh(reports, rejections.named, dict(rejections.counts), diagnoses)

    def _holds_lock(self, name: str, uid: int) -> bool:
        """Whether a live process of ``uid`` holds the lock of the rank file ``name``."""
        lock = self.directory / (name[: -len(DATA_SUFFIX)] + LOCK_SUFFIX)
        return lock_holder_alive(lock, None, frozenset({uid})) is True

    def read_changed_files(self) -> None:
        """Read and check the files served that changed since they were last read, without holding up a scrape,
        within the same budget: files that grew past it are left to the next refresh, which rejects them."""
        with self._lock:
            known = [(name, entry) for name, entry in self._entries.items() if entry.report is not None]
        updates = []
        budget = self.max_total_bytes
        for name, entry in known:  # in the refresh's order
            try:
                info = os.lstat(self.directory / name)
            except OSError:
                continue
            size = info.st_size if stat.S_ISREG(info.st_mode) and info.st_size <= self.max_file_bytes else 0
            if size > budget:
                continue
            budget -= size
            identity = file_identity(info)
            if identity != entry.identity:
                updates.append((name, entry, self._read(self.directory / name, identity, entry)))
        with self._lock:
            for name, old, new in updates:
                if self._entries.get(name) is old:  # not read meanwhile by a scrape
                    self._entries[name] = new

    def _read(self, path: Path, identity: tuple[int, int, int, int], previous: _Entry | None) -> _Entry:
        try:
            report = read_rank_file(
                path, self.max_file_bytes, previous.report if previous is not None else None, self.trusted
            )
        except RejectedFile as error:
            return _Entry(identity, None, error)
        except OSError as error:
            return _Entry(identity, None, RejectedFile("unreadable", error.strerror or str(error)))
        return _Entry(identity, report, None)
