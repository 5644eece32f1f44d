"""The spool: how every rank of a machine hands its metrics to the node endpoint (see deploy/PROTOCOL.md).

Each rank writes ``rank-<rank>.prom`` in the spool directory: one JSON line of metadata, then its full
exposition. Files are replaced atomically, so a reader never sees half a file. While a process writes a
rank's file it holds a POSIX lock on ``rank-<rank>.lock``; the kernel drops the lock when the process dies,
even on SIGKILL, which tells a reader in another container (another PID namespace) that the rank is dead,
and it keeps a second live process from overwriting the rank's file.

Nothing read from the directory is trusted: the directory must be a real directory, no more open than
``spool_mode`` allows (and, for a writer, its own); files are opened without following links or blocking, must be
regular and at most ``max_bytes``; a header of the wrong types or ranges, a file named for another rank, or an
exposition that is not a rank's own (``exposition_check``) is rejected with a reason, never served.
"""

from __future__ import annotations

import errno
import fcntl
import functools
import hashlib
import json
import logging
import math
import os
import re
import stat
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

from .. import run_identity
from ..config import SPOOL_MODES, user_ids
from ..diagnosis import rank_order
from .exposition_check import CheckedExposition, ExpositionError, recheck

log = logging.getLogger(__name__)

FORMAT_VERSION = 2  # 1: before run_id (0.1); such files are left alone
PREFIX = "rank-"
DATA_SUFFIX = ".prom"
LOCK_SUFFIX = ".lock"
DIAGNOSIS_SUFFIX = ".diagnosis.json"
TEMP_SUFFIX = ".tmp"
_NAME_SAFE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
MAX_NAME_PART = 100  # two parts and the affixes stay well under a file name's 255 bytes
RANK_LABEL = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
DEFAULT_MAX_BYTES = 4 * 1024 * 1024
MAX_HEADER_BYTES = 4096
MAX_PID = 2**31 - 1
MAX_TIME = 2.0**34  # unix seconds, year 2514: anything later is not a time this file could have been written
STALE_TEMP_SECONDS = 60.0  # a write takes milliseconds; an older temporary file is a killed writer's
DEFAULT_SPOOL_MODE = "private"
_OPEN_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class SpoolBusyError(OSError):
    """Another live process writes this rank's file (a forked child, or a second job on the same spool)."""


class SpoolDirError(OSError):
    """The spool directory is not safe to use; ``str()`` is one line saying why and what to do."""


class RejectedFile(ValueError):
    """A file in the spool directory that is not served; ``reason`` is a short class for the metric."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason


@dataclass(frozen=True)
class RankMeta:
    rank: str
    local_rank: str
    pid: int
    start_time: float  # the process's creation time (unix seconds): tells a reused pid from the original
    finished: bool = False  # the last report of a rank that ended cleanly (detach)
    last_step_time: float | None = None  # unix time of the rank's last step; None: use the file's age
    run_id: str = ""  # the run the rank belongs to (run_identity); "" is taken for this process's run

    def __post_init__(self):
        if not self.run_id:
            object.__setattr__(self, "run_id", run_identity.run_id())

    @classmethod
    def current(cls, rank: str = "0", local_rank: str = "0", **extra) -> RankMeta:
        return cls(str(rank), str(local_rank), os.getpid(), psutil.Process().create_time(), **extra)

    @classmethod
    def of(cls, meta: RankMeta | Mapping) -> RankMeta:
        """``meta`` itself, or a RankMeta from a mapping with the same keys (extra keys are ignored).
        Raises ``ValueError`` naming the first key of the wrong type or out of range."""
        if isinstance(meta, RankMeta):
            return meta
        if not isinstance(meta, Mapping):
            raise ValueError("the header is not a JSON object")
        last_step = meta.get("last_step_time")
        return cls(
            _label(meta, "rank"),
            _label(meta, "local_rank"),
            _number(meta, "pid", int, 1, MAX_PID),
            _number(meta, "start_time", float, 0, MAX_TIME),
            _flag(meta, "finished"),
            None if last_step is None else _number(meta, "last_step_time", float, 0, MAX_TIME),
            _label(meta, "run_id") if "run_id" in meta else "",
        )


def _label(meta: Mapping, key: str) -> str:
    value = meta.get(key)
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if key == "run_id":
        if not isinstance(value, str) or not (0 < len(value) <= run_identity.MAX_LENGTH and value.isprintable()):
            raise ValueError(f"{key}: expected 1 to {run_identity.MAX_LENGTH} printable characters")
        return value
    if not isinstance(value, str) or not RANK_LABEL.fullmatch(value):
        raise ValueError(f"{key}: expected 1 to 64 of A-Z a-z 0-9 _ . : -")
    return value


def _number(meta: Mapping, key: str, kind: type, low: float, high: float):
    value = meta.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not isinstance(value, int)):
        raise ValueError(f"{key}: expected {'an integer' if kind is int else 'a number'}")
    if isinstance(value, float) and not math.isfinite(value) or not low <= value <= high:
        raise ValueError(f"{key}: out of range")
    return kind(value)


def _flag(meta: Mapping, key: str) -> bool:
    value = meta.get(key, False)
    if not isinstance(value, bool):
        raise ValueError(f"{key}: expected true or false")
    return value


@dataclass(frozen=True)
class RankReport:
    meta: RankMeta
    exposition: bytes
    mtime: float  # when the file was last written (unix seconds)
    path: Path
    checked: CheckedExposition | None = field(default=None, compare=False, repr=False)

    @functools.cached_property  # a reader probes the lock of every rank at every scrape
    def stem(self) -> str:
        return file_stem(self.meta.rank, self.meta.run_id)

    @functools.cached_property
    def lock_path(self) -> Path:
        return self.path.with_name(self.stem + LOCK_SUFFIX)


def file_stem(rank: str, run_id: str) -> str:
    """``rank-<rank>.<run>``: one file set per rank of each run, so runs on one machine never collide. Both parts are
    escaped (``_name_part``): distinct ranks or runs never share a name, and the dot between them is the only one."""
    return f"{PREFIX}{_name_part(str(rank))}.{_name_part(str(run_id))}"


def _name_part(text: str) -> str:
    """``text`` in a file name, one to one: A-Z a-z 0-9 _ - as they are, every other byte of its UTF-8 as %XX; past
    ``MAX_NAME_PART`` characters, cut and followed by ``~`` and a hash of the whole (``~`` is otherwise escaped)."""
    escaped = "".join(
        chr(byte) if chr(byte) in _NAME_SAFE else f"%{byte:02X}" for byte in text.encode("utf-8", "surrogatepass")
    )
    if len(escaped) <= MAX_NAME_PART:
        return escaped
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"{escaped[: MAX_NAME_PART - 17]}~{digest}"


# -- the directory -----------------------------------------------------------------------------------------


def file_mode(spool_mode: str) -> int:
    return SPOOL_MODES[spool_mode][1]


def trusted_owners(users: str | None) -> frozenset[int]:
    """The uids a reader trusts to own the spool directory and the files in it: root, the reader's own user, and
    ``users`` (the ``spool_trusted_users`` option, checked when it was read)."""
    return frozenset({0, os.geteuid(), *user_ids(users)})


def file_trust(spool_mode: str, trusted: frozenset[int]) -> frozenset[int] | None:
    """Whose files a reader serves: the trusted users', or, in the shared sticky modes, any user's (what those modes
    are for; the directory's mode already says who may write there)."""
    return None if SPOOL_MODES[spool_mode][0] & stat.S_ISVTX else trusted


def check_spool_dir(
    spool_dir, spool_mode: str = DEFAULT_SPOOL_MODE, writer: bool = True, trusted: frozenset[int] | None = None
) -> None:
    """Raise ``SpoolDirError`` unless ``spool_dir`` is a real directory that nobody beyond ``spool_mode`` can write
    to. A writer also needs it to be its own (or, for the shared sticky modes, root's): a directory that another
    user made could hold links and files laid for the writer to trip on. A reader given ``trusted`` needs it to
    belong to one of those uids: another user could have made it first and filled it with forged ranks."""
    mode = SPOOL_MODES[spool_mode][0]
    try:
        info = os.lstat(spool_dir)
    except OSError as error:
        raise SpoolDirError(error.errno, f"spool directory {spool_dir}: {error.strerror}") from None
    if stat.S_ISLNK(info.st_mode):
        raise SpoolDirError(errno.ELOOP, f"spool directory {spool_dir} is a symbolic link; give the real path")
    if not stat.S_ISDIR(info.st_mode):
        raise SpoolDirError(errno.ENOTDIR, f"spool directory {spool_dir} is not a directory")
    actual = stat.S_IMODE(info.st_mode)
    opened = actual & 0o022 & ~mode
    if opened or (actual & 0o002 and not actual & stat.S_ISVTX):
        who = "everyone" if actual & 0o002 else "its group"
        raise SpoolDirError(
            errno.EPERM,
            f"spool directory {spool_dir} is writable by {who} (mode {actual:04o}; "
            f"spool_mode {spool_mode} allows {mode:04o}): fix its mode or set spool_mode",
        )
    uid = os.geteuid()
    if not writer and trusted is not None and info.st_uid not in trusted:
        raise SpoolDirError(
            errno.EPERM,
            f"spool directory {spool_dir} belongs to uid {info.st_uid}, whom this reader "
            f"does not trust (root, uid {uid} and spool_trusted_users): set "
            "spool_trusted_users to the user whose jobs write there, or use another "
            "directory",
        )
    if writer and info.st_uid != uid and not (mode & stat.S_ISVTX and info.st_uid == 0):
        raise SpoolDirError(
            errno.EPERM,
            f"spool directory {spool_dir} belongs to uid {info.st_uid}, not to this "
            f"user (uid {uid}); use a directory of your own (spool_dir)",
        )


def prepare_spool_dir(spool_dir, spool_mode: str = DEFAULT_SPOOL_MODE) -> None:
    """Create the spool directory (again, if it was deleted) with ``spool_mode``, then check it."""
    path = Path(spool_dir)
    if not os.path.lexists(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.mkdir(path, 0o700)
            os.chmod(path, SPOOL_MODES[spool_mode][0])  # mkdir's mode passes through the umask
        except FileExistsError:
            pass
    check_spool_dir(path, spool_mode, writer=True)


# -- writing -------------------------------------------------------------------------------------------------

_held_locks: dict[Path, tuple[int, int]] = {}  # lock file -> (pid that holds it, fd)
_held_guard = threading.Lock()


def write_rank_file(
    spool_dir,
    meta: RankMeta | Mapping,
    exposition: bytes,
    spool_mode: str = DEFAULT_SPOOL_MODE,
    diagnosis: bytes | None = None,
) -> Path:
    """Atomically replace this rank's file with ``meta`` and ``exposition``; returns its path.

    The directory is created (again) and checked at every write. The first write of a process takes the rank's
    lock and keeps it (and takes it again if the directory was deleted); a ``finished`` report releases it.
    Raises ``SpoolDirError`` for an unsafe directory, ``SpoolBusyError`` if another live process holds the rank,
    ``OSError`` on I/O errors: call it from a background thread and count the errors, never from the training loop.
    """
    meta = RankMeta.of(meta)
    directory = Path(spool_dir)
    prepare_spool_dir(directory, spool_mode)
    stem = file_stem(meta.rank, meta.run_id)
    lock_path = directory / (stem + LOCK_SUFFIX)
    if _hold_lock(lock_path, meta.rank, file_mode(spool_mode)):
        remove_stale_temp_files(directory)  # a killed writer's leftovers
    path = directory / (stem + DATA_SUFFIX)
    if diagnosis is not None:
        _replace(directory / (stem + DIAGNOSIS_SUFFIX), diagnosis, spool_mode)
    header = json.dumps({"format": FORMAT_VERSION, **asdict(meta)}, separators=(",", ":")).encode()
    _replace(path, header + b"\n" + exposition, spool_mode)
    if meta.finished:
        release_rank_lock(spool_dir, meta.rank, meta.run_id)
    return path


def _replace(path: Path, data: bytes, spool_mode: str) -> None:
    # A fresh, unpredictable name, created exclusively: nothing another user laid in the directory is followed.
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TEMP_SUFFIX, dir=path.parent)
    try:
        os.fchmod(fd, file_mode(spool_mode))
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(temp, path)
    except BaseException:
        os.unlink(temp)
        raise


def read_diagnosis(report: RankReport, max_bytes: int, trusted: frozenset[int] | None = None) -> bytes | None:
    """The diagnosis file written with ``report`` (its bytes, unchecked), or None if there is none to read;
    ``RejectedFile`` if it is not one to read (too large, not a regular file, another user's)."""
    try:
        fd, _ = _open_regular(report.path.with_name(report.stem + DIAGNOSIS_SUFFIX), max_bytes, trusted)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        return f.read(max_bytes + 1)


def _same_file(fd: int, path: Path) -> bool:
    try:
        on_disk = os.lstat(path)
    except OSError:
        return False
    held = os.fstat(fd)
    return (on_disk.st_dev, on_disk.st_ino) == (held.st_dev, held.st_ino)


def _hold_lock(lock_path: Path, rank: str, mode: int) -> bool:
    """Hold the rank's lock; True if it was taken now (not already held)."""
    pid = os.getpid()
    with _held_guard:
        held = _held_locks.get(lock_path)
        if held is not None and held[0] == pid and _same_file(held[1], lock_path):
            return False
        if held is not None:  # inherited through fork (the lock stayed with the parent), or the file was deleted
            os.close(held[1])
            del _held_locks[lock_path]
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | _OPEN_FLAGS, mode)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise SpoolDirError(errno.EINVAL, f"{lock_path} is not a regular file")
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
        return True


def release_rank_lock(spool_dir, rank: str, run_id: str | None = None) -> None:
    """Give up the rank's lock (from now on, readers see the rank's process as gone)."""
    lock_path = Path(spool_dir) / (file_stem(rank, run_id or run_identity.run_id()) + LOCK_SUFFIX)
    with _held_guard:
        held = _held_locks.pop(lock_path, None)
        if held is not None:
            os.close(held[1])  # closing the file drops the lock


# -- reading -------------------------------------------------------------------------------------------------


def _open_regular(path: Path, max_bytes: int, trusted: frozenset[int] | None = None) -> tuple[int, os.stat_result]:
    """An fd of ``path`` opened read-only without following a link or blocking on a FIFO, if it is a regular file
    of at most ``max_bytes`` (owned by one of ``trusted``, if given); ``RejectedFile`` otherwise, ``OSError`` if it
    cannot be opened."""
    try:
        fd = os.open(path, os.O_RDONLY | _OPEN_FLAGS)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise RejectedFile("not_regular", "a symbolic link") from None
        raise
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise RejectedFile("not_regular", "not a regular file")
    if trusted is not None and info.st_uid not in trusted:
        os.close(fd)
        raise RejectedFile("untrusted_owner", f"owned by uid {info.st_uid}, whom the reader does not trust")
    if info.st_size > max_bytes:
        os.close(fd)
        raise RejectedFile("too_large", f"{info.st_size} bytes, more than the {max_bytes} allowed")
    return fd, info


def file_identity(info: os.stat_result) -> tuple[int, int, int, int]:
    """What changes whenever a file is replaced or rewritten (a rank replaces its file by a rename)."""
    return info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns


def read_rank_file(
    path, max_bytes: int = DEFAULT_MAX_BYTES, previous: RankReport | None = None, trusted: frozenset[int] | None = None
) -> RankReport | None:
    """The report in ``path``; None if it vanished; ``RejectedFile`` if it is not a rank file to serve.
    ``previous``, the last report read from the same path, lets a rewrite that changed only values be checked by
    its values."""
    path = Path(path)
    try:
        fd, info = _open_regular(path, max_bytes, trusted)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise RejectedFile("too_large", f"more than the {max_bytes} bytes allowed")
    header, newline, exposition = data.partition(b"\n")
    if not newline or len(header) > MAX_HEADER_BYTES:
        raise RejectedFile("bad_header", "no header line of at most 4096 bytes")
    try:
        fields = json.loads(header)
        if isinstance(fields, dict) and fields.get("format") == 1:
            return None  # written by an exporter from before run_id: not served, not an attack
        if not isinstance(fields, dict) or fields.get("format") != FORMAT_VERSION or "run_id" not in fields:
            raise ValueError(f"not a rank file of format {FORMAT_VERSION}")
        meta = RankMeta.of(fields)
    except (ValueError, RecursionError) as error:
        raise RejectedFile("bad_header", f"header: {str(error)[:100]}") from None
    if file_stem(meta.rank, meta.run_id) + DATA_SUFFIX != path.name:
        raise RejectedFile("wrong_rank", f"the header says rank {meta.rank} of run {meta.run_id}")
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


def read_rank_files(
    spool_dir, max_bytes: int = DEFAULT_MAX_BYTES, rejected: list[tuple[str, RejectedFile]] | None = None
) -> list[RankReport]:
    """Every good rank file in ``spool_dir``, ordered by run and rank (numerically where ranks are numbers). Files that
    are rejected are left out, and appended to ``rejected`` as (file name, error) when it is given."""
    try:
        names = os.listdir(spool_dir)
    except OSError:
        return []
    reports = []
    for name in names:
        if not (name.startswith(PREFIX) and name.endswith(DATA_SUFFIX)):
            continue
        try:
            report = read_rank_file(Path(spool_dir) / name, max_bytes)
        except RejectedFile as error:
            if rejected is not None:
                rejected.append((name, error))
            continue
        except OSError as error:
            if rejected is not None:
                rejected.append((name, RejectedFile("unreadable", error.strerror or str(error))))
            continue
        if report is not None:
            reports.append(report)
    return sorted(reports, key=lambda r: (r.meta.run_id, rank_order(r.meta.rank)))


def writer_alive(report: RankReport, trusted: frozenset[int] | None = None) -> bool | None:
    """Whether the process that wrote ``report`` still runs: True, False, or None if it cannot be told. A lock file
    owned by none of ``trusted`` proves nothing: the process is looked up instead."""
    if report.meta.pid == os.getpid() and abs(report.meta.start_time - _own_start_time()) < 0.01:
        return True  # never probe our own lock: closing the probe would release it
    try:
        fd, _ = _open_regular(report.lock_path, 0, trusted)
    except (OSError, RejectedFile):
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


# -- expiry --------------------------------------------------------------------------------------------------


def remove_rank_files(report: RankReport) -> None:
    """Delete a rank's files (best effort: a reader without write access to the directory leaves them)."""
    diagnosis = report.path.with_name(report.stem + DIAGNOSIS_SUFFIX)
    for path in (report.path, report.lock_path, diagnosis):
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            log.debug("cannot remove %s: %s", path.name, exc.strerror)


def is_expired(report: RankReport, expire_after_seconds: float, now: float) -> bool:
    return now - report.mtime > expire_after_seconds


def remove_stale_temp_files(spool_dir, now: float | None = None) -> None:
    """Delete temporary files left by writers killed mid-write (best effort)."""
    now = time.time() if now is None else now
    try:
        for entry in os.scandir(spool_dir):
            if (
                entry.name.startswith("." + PREFIX)
                and entry.name.endswith(TEMP_SUFFIX)
                and now - entry.stat(follow_symlinks=False).st_mtime > STALE_TEMP_SECONDS
            ):
                os.unlink(entry.path)
    except OSError:
        pass
