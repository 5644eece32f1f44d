"""The training side of the spool: a rank writes its file atomically and holds its rank's lock while it runs.

Files are replaced by a rename, so a reader never sees half a file. While a process writes a rank's file it holds a
POSIX lock on ``rank-<rank>.<run>.lock``; the kernel drops the lock when the process dies, even on SIGKILL, which
tells a reader in another container (another PID namespace) that the rank is dead, and it keeps a second live
process from overwriting the rank's file.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import stat
import tempfile
import time
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path

from .. import fork_safe, run_identity
from .spool_dir import OPEN_FLAGS, SpoolDirError, file_mode, prepare_spool_dir
from .spool_expiry import remove_stale_temp_files
from .spool_format import (
    DATA_SUFFIX,
    DEFAULT_SPOOL_MODE,
    DIAGNOSIS_SUFFIX,
    FORMAT_VERSION,
    LOCK_SUFFIX,
    TEMP_SUFFIX,
    RankMeta,
    file_stem,
)


class SpoolBusyError(OSError):
    """Another live process writes this rank's file (a forked child, or a second job on the same spool)."""


_held_locks: dict[Path, tuple[int, int]] = {}  # lock file -> (pid that holds it, fd)
_held_guard = fork_safe.Lock()


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
    fields = {"format": FORMAT_VERSION, **asdict(meta)}
    if meta.history is None:
        del fields["history"]
    header = json.dumps(fields, separators=(",", ":")).encode()
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
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | OPEN_FLAGS, mode)
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
