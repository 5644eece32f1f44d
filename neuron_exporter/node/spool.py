"""The spool: how every rank of a machine hands its metrics to the node endpoint (see deploy/PROTOCOL.md).

Each rank writes ``rank-<rank>.prom`` in the spool directory: one JSON line of metadata, then its full
exposition. Files are replaced atomically, so a reader never sees half a file. While a process writes a
rank's file it holds a POSIX lock on ``rank-<rank>.lock``; the kernel drops the lock when the process dies,
even on SIGKILL, which tells a reader in another container (another PID namespace) that the rank is dead,
and it keeps a second live process from overwriting the rank's file.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import re
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
PREFIX = "rank-"
DATA_SUFFIX = ".prom"
LOCK_SUFFIX = ".lock"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


class SpoolBusyError(OSError):
    """Another live process writes this rank's file (a forked child, or a second job on the same spool)."""


@dataclass(frozen=True)
class RankMeta:
    rank: str
    local_rank: str
    pid: int
    start_time: float  # the process's creation time (unix seconds): tells a reused pid from the original
    finished: bool = False  # the last report of a rank that ended cleanly (detach)
    last_step_time: float | None = None  # unix time of the rank's last step; None: use the file's age

    @classmethod
    def current(cls, rank: str = "0", local_rank: str = "0", **extra) -> RankMeta:
        return cls(str(rank), str(local_rank), os.getpid(), psutil.Process().create_time(), **extra)

    @classmethod
    def of(cls, meta: RankMeta | Mapping) -> RankMeta:
        """``meta`` itself, or a RankMeta from a mapping with the same keys (extra keys are ignored)."""
        if isinstance(meta, RankMeta):
            return meta
        last_step = meta.get("last_step_time")
        return cls(str(meta["rank"]), str(meta["local_rank"]), int(meta["pid"]), float(meta["start_time"]),
                   bool(meta.get("finished", False)), None if last_step is None else float(last_step))


@dataclass(frozen=True)
class RankReport:
    meta: RankMeta
    exposition: bytes
    mtime: float  # when the file was last written (unix seconds)
    path: Path

    @property
    def lock_path(self) -> Path:
        return self.path.with_suffix(LOCK_SUFFIX)


def file_stem(rank: str) -> str:
    return PREFIX + (_UNSAFE.sub("_", str(rank)) or "_")


# -- writing -------------------------------------------------------------------------------------------------

_held_locks: dict[Path, tuple[int, int]] = {}  # lock file -> (pid that holds it, fd)
_held_guard = threading.Lock()


def write_rank_file(spool_dir, meta: RankMeta | Mapping, exposition: bytes) -> Path:
    """Atomically replace this rank's file with ``meta`` and ``exposition``; returns its path.

    The first write of a process takes the rank's lock and keeps it; a ``finished`` report releases it.
    Raises ``SpoolBusyError`` if another live process holds the rank, ``OSError`` on I/O errors: call it
    from a background thread and count the errors, never from the training loop.
    """
    meta = RankMeta.of(meta)
    directory = Path(spool_dir)
    directory.mkdir(parents=True, exist_ok=True)
    stem = file_stem(meta.rank)
    lock_path = directory / (stem + LOCK_SUFFIX)
    _hold_lock(lock_path, meta.rank)
    path = directory / (stem + DATA_SUFFIX)
    header = json.dumps({"format": FORMAT_VERSION, **asdict(meta)}, separators=(",", ":")).encode()
    temp = directory / f".{path.name}.{os.getpid()}.tmp"
    try:
        with open(temp, "wb") as f:
            f.write(header + b"\n" + exposition)
        os.chmod(temp, 0o644)
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    if meta.finished:
        release_rank_lock(spool_dir, meta.rank)
    return path


def _hold_lock(lock_path: Path, rank: str) -> None:
    pid = os.getpid()
    with _held_guard:
        held = _held_locks.get(lock_path)
        if held is not None and held[0] == pid:
            return
        if held is not None:  # inherited through fork: the lock stayed with the parent
            os.close(held[1])
            del _held_locks[lock_path]
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        # A reader probing the lock holds it for microseconds: retry briefly before calling the rank busy.
        for _ in range(20):
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EACCES, errno.EAGAIN):
                    os.close(fd)
                    raise
                time.sleep(0.005)
        else:
            os.close(fd)
            raise SpoolBusyError(errno.EBUSY, f"another live process reports as rank {rank} in this spool directory")
        _held_locks[lock_path] = (pid, fd)


def release_rank_lock(spool_dir, rank: str) -> None:
    """Give up the rank's lock (from now on, readers see the rank's process as gone)."""
    lock_path = Path(spool_dir) / (file_stem(rank) + LOCK_SUFFIX)
    with _held_guard:
        held = _held_locks.pop(lock_path, None)
        if held is not None:
            os.close(held[1])  # closing the file drops the lock


# -- reading -------------------------------------------------------------------------------------------------

def read_rank_file(path) -> RankReport | None:
    """The report in ``path``; None if it vanished or is not a rank file of this format."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            mtime = os.fstat(f.fileno()).st_mtime
            data = f.read()
    except OSError:
        return None
    header, _, exposition = data.partition(b"\n")
    try:
        fields = json.loads(header)
        if fields.get("format") != FORMAT_VERSION:
            return None
        meta = RankMeta.of(fields)
    except (ValueError, KeyError, TypeError, AttributeError):
        log.debug("ignoring %s: not a rank file", path.name)
        return None
    return RankReport(meta, exposition, mtime, path)


def read_rank_files(spool_dir) -> list[RankReport]:
    """Every rank file in ``spool_dir``, ordered by rank (numerically where ranks are numbers)."""
    try:
        names = os.listdir(spool_dir)
    except OSError:
        return []
    reports = [read_rank_file(Path(spool_dir) / name) for name in names
               if name.startswith(PREFIX) and name.endswith(DATA_SUFFIX)]
    return sorted((r for r in reports if r is not None), key=lambda r: rank_order(r.meta.rank))


def rank_order(rank: str):
    return (0, int(rank), "") if rank.isdigit() else (1, 0, rank)


def writer_alive(report: RankReport) -> bool | None:
    """Whether the process that wrote ``report`` still runs: True, False, or None if it cannot be told."""
    if report.meta.pid == os.getpid() and abs(report.meta.start_time - _own_start_time()) < 0.01:
        return True  # never probe our own lock: closing the probe would release it
    try:
        fd = os.open(report.lock_path, os.O_RDONLY)
    except OSError:
        return _pid_alive(report.meta)
    try:
        fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EAGAIN):
            return True  # the writer holds its lock
        return _pid_alive(report.meta)
    else:
        fcntl.lockf(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


_own = {}


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


# -- expiry --------------------------------------------------------------------------------------------------

def remove_rank_files(report: RankReport) -> None:
    """Delete a rank's files (best effort: a reader without write access to the directory leaves them)."""
    for path in (report.path, report.lock_path):
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            log.debug("cannot remove %s: %s", path.name, exc.strerror)


def is_expired(report: RankReport, expire_after_seconds: float, now: float) -> bool:
    return now - report.mtime > expire_after_seconds


def remove_expired(spool_dir, expire_after_seconds: float, now: float | None = None) -> list[RankReport]:
    """Delete the files of ranks whose process is gone and whose last report is older than the expiry,
    and temporary files left by writers killed mid-write. Returns the removed reports."""
    now = time.time() if now is None else now
    removed = []
    for report in read_rank_files(spool_dir):
        if is_expired(report, expire_after_seconds, now) and writer_alive(report) is False:
            remove_rank_files(report)
            removed.append(report)
    try:
        for entry in os.scandir(spool_dir):
            if entry.name.startswith("." + PREFIX) and entry.name.endswith(".tmp") \
                    and now - entry.stat().st_mtime > expire_after_seconds:
                os.unlink(entry.path)
    except OSError:
        pass
    return removed
