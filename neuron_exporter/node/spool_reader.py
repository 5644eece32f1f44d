"""The node endpoint's reading of the spool directory: each rank file read and checked once per change, within a
budget.

A rank rewrites its file every ``spool_interval_seconds``; a scrape may come many times in between. The reader keeps
the last report of every file with the file's identity (inode, size, modification time): a file whose identity did not
change is not read again, and a rewrite that changed only values is checked by its values (``exposition_check``).
Rejections are remembered the same way, so a bad file costs one read per change, not one per scrape.

What one refresh may read is bounded: at most ``max_files`` rank files and ``max_total_bytes`` in all, taken in the
order of their runs and ranks; the rest are rejected as ``over_budget`` without being opened. With ``run_id``, only
that run's files are looked at (a training job's own endpoint): other runs' files are never opened.

An endpoint with a background thread keeps the checking off the scrape path: a scrape (``refresh(read_changed=False)``)
serves the last checked version of a file that changed, and the thread (``read_changed_files``) reads the new one.
"""

from __future__ import annotations

import os
import stat
import threading
from dataclasses import dataclass
from pathlib import Path

from ..diagnosis import rank_order
from .spool import DATA_SUFFIX, PREFIX, RankReport, RejectedFile, file_identity, file_stem, read_rank_file

DEFAULT_MAX_FILES = 1024
DEFAULT_MAX_TOTAL_BYTES = 64 * 1024 * 1024


@dataclass
class _Entry:
    identity: tuple[int, int, int, int]
    report: RankReport | None  # None: the file was rejected (``rejection``) or vanished
    rejection: RejectedFile | None


class SpoolReader:
    def __init__(
        self,
        directory,
        max_file_bytes: int,
        max_total_bytes: int = DEFAULT_MAX_TOTAL_BYTES,
        max_files: int = DEFAULT_MAX_FILES,
        run_id: str | None = None,
        trusted: frozenset[int] | None = None,
    ):
        """``trusted``: the uids whose files are served (``spool.file_trust``); None: anyone's."""
        self.directory = Path(directory)
        self.trusted = trusted
        self.max_file_bytes = max_file_bytes
        self.max_total_bytes = max_total_bytes
        self.max_files = max_files
        # A run's files end with its part of the file name; the header, checked on reading, has the last word.
        self._suffix = DATA_SUFFIX if run_id is None else "." + file_stem("0", run_id).split(".", 1)[1] + DATA_SUFFIX
        self._entries: dict[str, _Entry] = {}
        self._lock = threading.Lock()
        self.over_budget = 0  # files left out by the last refresh for the budget

    def refresh(self, read_changed: bool = True) -> tuple[list[RankReport], list[tuple[str, RejectedFile]]]:
        """The reports of every good rank file, ordered by run and rank, and the files rejected (name, reason).
        ``read_changed=False``: a file that changed since it was served is served as it was (``read_changed_files``
        reads it); new files, and files that were rejected, are read now."""
        with self._lock:
            return self._refresh(read_changed)

    def _refresh(self, read_changed: bool) -> tuple[list[RankReport], list[tuple[str, RejectedFile]]]:
        try:
            names = [
                name for name in os.listdir(self.directory) if name.startswith(PREFIX) and name.endswith(self._suffix)
            ]
        except OSError:
            names = []
        names.sort(key=_order)
        reports: list[RankReport] = []
        rejected: list[tuple[str, RejectedFile]] = []
        entries: dict[str, _Entry] = {}
        budget = self.max_total_bytes
        self.over_budget = 0
        for index, name in enumerate(names):
            path = self.directory / name
            try:
                info = os.lstat(path)
            except OSError:
                continue  # gone since the listing
            if index >= self.max_files or (stat.S_ISREG(info.st_mode) and info.st_size > budget):
                self.over_budget += 1
                rejected.append(
                    (
                        name,
                        RejectedFile(
                            "over_budget",
                            "the spool directory holds more than the "
                            f"{self.max_files} files or {self.max_total_bytes} bytes "
                            "the endpoint reads",
                        ),
                    )
                )
                continue
            entry = self._entries.get(name)
            identity = file_identity(info)
            if entry is None or (entry.identity != identity and (read_changed or entry.report is None)):
                entry = self._read(path, identity, entry)
            if stat.S_ISREG(info.st_mode) and info.st_size <= self.max_file_bytes:
                budget -= info.st_size  # what was read
            entries[name] = entry
            if entry.report is not None:
                reports.append(entry.report)
            elif entry.rejection is not None:
                rejected.append((name, entry.rejection))
        self._entries = entries
        reports.sort(key=lambda r: (r.meta.run_id, rank_order(r.meta.rank)))
        return reports, rejected

    def read_changed_files(self) -> None:
        """Read and check the files that changed since they were last read, without holding up a scrape."""
        with self._lock:
            known = list(self._entries.items())
        updates = []
        for name, entry in known:
            try:
                identity = file_identity(os.lstat(self.directory / name))
            except OSError:
                continue
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


def _order(name: str):
    """Files in the order of their runs, then ranks (numerically where ranks are numbers), from their names."""
    rank, _, run = name[len(PREFIX) : -len(DATA_SUFFIX)].partition(".")
    return run, rank_order(rank)
