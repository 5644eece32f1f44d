"""Whoever serves a spool removes what the ranks left behind: the files of ranks that ended, once their last report is
older than ``expire_after_seconds``, and the temporary files of writers killed mid-write.

A rank has ended when no live process holds its lock (it finished and released it, or it died); a rank whose lock
cannot be probed is looked up by the pid and start time of its header, and one that cannot be told is kept. Removal
is best effort: a reader that may not delete a file (no write access to the directory, another user's file in a
sticky directory) leaves it, and says so only in the debug log.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from ..config import Options
from .spool import DATA_SUFFIX, LOCK_SUFFIX, PREFIX, TEMP_SUFFIX, RankReport, split_name
from .spool_dir import SpoolDirError, check_spool_dir, file_trust, trusted_owners
from .spool_reader import probing_lock, read_header

log = logging.getLogger(__name__)

STALE_TEMP_SECONDS = 60.0  # a write takes milliseconds; an older temporary file is a killed writer's
CHECK_INTERVAL_SECONDS = 60.0  # how often a server of the spool removes expired files


def is_expired(report: RankReport, expire_after_seconds: float, now: float) -> bool:
    return now - report.mtime > expire_after_seconds


def remove_expired(options: Options, now: float | None = None) -> int:
    """What a server of the spool (the daemon, a job's endpoint) calls every ``CHECK_INTERVAL_SECONDS``: the expired
    files of ``options.spool_dir`` removed, if the directory is one it trusts (``remove_expired_files``). Returns how
    many files were removed; never raises."""
    trusted = trusted_owners(options.spool_trusted_users)
    try:
        check_spool_dir(options.spool_dir, options.spool_mode, writer=False, trusted=trusted)
    except SpoolDirError:
        return 0  # missing, or not to be touched: the endpoint's spool_directory_ok says which
    return remove_expired_files(
        options.spool_dir, options.expire_after_seconds, file_trust(options.spool_mode, trusted), now
    )


def remove_expired_files(
    spool_dir, expire_after_seconds: float, trusted: frozenset[int] | None = None, now: float | None = None
) -> int:
    """Delete the files of every rank of ``spool_dir`` that ended and whose last report (else its newest file) is
    older than ``expire_after_seconds``, and stale temporary files; returns how many files were deleted.
    ``trusted``: the uids whose lock files are believed (``spool_dir.file_trust``). Never raises."""
    now = time.time() if now is None else now
    removed = remove_stale_temp_files(spool_dir, now)
    ranks: dict[str, dict[str, float]] = {}  # stem -> {suffix: modification time}
    try:
        with os.scandir(spool_dir) as entries:
            for entry in entries:
                parts = split_name(entry.name)
                if parts is not None:
                    ranks.setdefault(parts[0], {})[parts[2]] = entry.stat(follow_symlinks=False).st_mtime
    except OSError:
        return removed
    directory = Path(spool_dir)
    for stem, files in ranks.items():
        last_report = files.get(DATA_SUFFIX, max(files.values()))  # a lock file is as old as its rank
        if now - last_report <= expire_after_seconds:
            continue
        meta = read_header(directory / (stem + DATA_SUFFIX), trusted) if DATA_SUFFIX in files else None
        with probing_lock(directory / (stem + LOCK_SUFFIX), meta, trusted) as alive:
            nobodys = meta is None and LOCK_SUFFIX not in files  # no lock and no header: no rank to ask
            if not (alive is False or (alive is None and nobodys)):
                continue  # alive, or it cannot be told
            if _written_since(directory / (stem + DATA_SUFFIX), files.get(DATA_SUFFIX)):
                continue  # a rank of the same name (a restart in the same run) wrote since the listing
            for suffix in files:
                removed += _remove(directory / (stem + suffix))
    return removed


def _written_since(path: Path, listed_mtime: float | None) -> bool:
    try:
        return os.lstat(path).st_mtime != listed_mtime
    except OSError:
        return False  # gone, as listed or since


def remove_stale_temp_files(spool_dir, now: float | None = None) -> int:
    """Delete temporary files left by writers killed mid-write (best effort); returns how many."""
    now = time.time() if now is None else now
    removed = 0
    try:
        with os.scandir(spool_dir) as entries:
            for entry in entries:
                if (
                    entry.name.startswith("." + PREFIX)
                    and entry.name.endswith(TEMP_SUFFIX)
                    and now - entry.stat(follow_symlinks=False).st_mtime > STALE_TEMP_SECONDS
                ):
                    removed += _remove(Path(entry.path))
    except OSError:
        pass
    return removed


def _remove(path: Path) -> int:
    try:
        path.unlink()
    except OSError as error:
        log.debug("cannot remove %s: %s", path.name, error.strerror)
        return 0
    return 1
