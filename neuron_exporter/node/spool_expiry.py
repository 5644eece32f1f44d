"""Whoever serves a spool removes what the ranks left behind: the files of ranks that ended, once their last report is
older than ``expire_after_seconds``, and the temporary files of writers killed mid-write. A file's age is judged on
the server's own clocks too (``seen_times``): a modification time ahead of now (a clock set back) does not keep a file
for ever.

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

from .seen_times import SeenTimes
from .spool_dir import Spool, SpoolDirError
from .spool_format import DATA_SUFFIX, LOCK_SUFFIX, PREFIX, TEMP_SUFFIX, RankReport, split_name
from .spool_reader import probing_lock, read_header

log = logging.getLogger(__name__)

STALE_TEMP_SECONDS = 60.0  # a write takes milliseconds; an older temporary file is a killed writer's
CHECK_INTERVAL_SECONDS = 60.0  # how often a server of the spool removes expired files


def is_expired(report: RankReport, expire_after_seconds: float, seen: SeenTimes, now: float | None = None) -> bool:
    """Whether ``report`` is past the expiry; ``seen`` keeps, for the reader, when each file was last seen to change."""
    return seen.age(report.path, report.mtime, report.mtime, now)[1] > expire_after_seconds


class ExpiredFiles:
    """What a server of the spool (the daemon, a job's endpoint) removes every ``CHECK_INTERVAL_SECONDS``; it keeps
    when it last saw each file change, from one removal to the next."""

    def __init__(self, spool: Spool, expire_after_seconds: float):
        self.spool, self.expire_after_seconds = spool, expire_after_seconds
        self._ranks = SeenTimes()  # rank file stems
        self._temporary = SeenTimes()  # names of temporary files

    def remove(self, now: float | None = None) -> int:
        """The expired files of the spool removed, if the directory is one it trusts (``remove_files``). Returns how
        many files were removed; never raises."""
        try:
            self.spool.check()
        except SpoolDirError:
            return 0  # missing, or not to be touched: the endpoint's spool_directory_ok says which
        return self.remove_files(now)

    def remove_files(self, now: float | None = None) -> int:
        """Delete the files of every rank of the spool that ended and whose last report (else its newest file) is
        older than ``expire_after_seconds``, and stale temporary files; returns how many files were deleted. Lock
        files are believed if they belong to ``spool.file_owners``. Never raises."""
        now = time.time() if now is None else now
        directory, trusted = self.spool.directory, self.spool.file_owners
        removed = self.remove_stale_temp_files(now)
        ranks: dict[str, dict[str, float]] = {}  # stem -> {suffix: modification time}
        try:
            with os.scandir(directory) as entries:
                for entry in entries:
                    parts = split_name(entry.name)
                    if parts is not None:
                        ranks.setdefault(parts[0], {})[parts[2]] = entry.stat(follow_symlinks=False).st_mtime
        except OSError:
            return removed
        self._ranks.keep_only(ranks)
        for stem, files in ranks.items():
            last_report = files.get(DATA_SUFFIX, max(files.values()))  # a lock file is as old as its rank
            if self._ranks.age(stem, last_report, last_report, now)[1] <= self.expire_after_seconds:
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

    def remove_stale_temp_files(self, now: float | None = None) -> int:
        """Delete temporary files left by writers killed mid-write (best effort); returns how many."""
        now = time.time() if now is None else now
        ages = []
        try:
            with os.scandir(self.spool.directory) as entries:
                for entry in entries:
                    if entry.name.startswith("." + PREFIX) and entry.name.endswith(TEMP_SUFFIX):
                        mtime = entry.stat(follow_symlinks=False).st_mtime
                        ages.append((entry.name, self._temporary.age(entry.name, mtime, mtime, now)[1]))
        except OSError:
            pass
        self._temporary.keep_only(name for name, _ in ages)
        directory = self.spool.directory
        return sum(_remove(directory / name) for name, age in ages if age > STALE_TEMP_SECONDS)


def remove_stale_temp_files(spool_dir, now: float | None = None) -> int:
    """``ExpiredFiles.remove_stale_temp_files``, once (a writer, as it starts)."""
    return ExpiredFiles(Spool(spool_dir), 0.0).remove_stale_temp_files(now)


def _written_since(path: Path, listed_mtime: float | None) -> bool:
    try:
        return os.lstat(path).st_mtime != listed_mtime
    except OSError:
        return False  # gone, as listed or since


def _remove(path: Path) -> int:
    try:
        path.unlink()
    except OSError as error:
        log.debug("cannot remove %s: %s", path.name, error.strerror)
        return 0
    return 1
