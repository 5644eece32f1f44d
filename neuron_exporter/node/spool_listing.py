"""Which rank files a refresh of the spool directory looks at, and in what order.

In a shared spool any local user may lay rank files with any name, modification time, size and content, as many as
the filesystem holds. So the order starts from what only the kernel can say about a file, who owns it and whether a
live process holds its rank's lock, and only then from what the file says:

1. the files of the users the reader trusts (root, its own user, ``spool_trusted_users``);
2. the other users' files of ranks whose writer holds its lock (a live rank);
3. the rest.

In the first class, and within one user's files in the others, live runs come first: the files written in the last
``FRESH_SECONDS`` (a live rank rewrites its file every couple of seconds) in the order of their runs and ranks, then the
others, the most recent first, and last those whose times lie ahead of now. In the second and third classes the users
take turns: the next file is always the next one of the user whose files taken so far cost the least (their bytes, plus
a share of the budget for each file), so one user's files never crowd out another's.

A file rejected from its directory entry alone (not a regular file, too large, another user's where only trusted
users are served) is never opened and takes nothing from any budget. Of the others, at most ``limit`` are looked at;
the rest are rejected as ``over_budget`` unopened. The listing is one pass over the directory that keeps at most
``limit`` files of each user and the names of ``MAX_NAMED_REJECTIONS`` rejected files, however many the directory
holds.
"""

from __future__ import annotations

import heapq
import os
import stat
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

from ..diagnosis import rank_order
from .spool_format import DATA_SUFFIX, PREFIX, RejectedFile

FRESH_SECONDS = 60.0
MAX_NAMED_REJECTIONS = 1000  # rejected files named (for the log); all of them are counted
FIRST = -1  # no uid: the files of the users that come first, together


class Listed(NamedTuple):
    name: str
    info: os.stat_result  # from the directory listing (lstat): opening the file checks again


class Rejections:
    """The files a refresh leaves out: all counted by reason, the first ``MAX_NAMED_REJECTIONS`` by name."""

    def __init__(self, over_budget: RejectedFile):
        self.over_budget = over_budget
        self.counts: Counter[str] = Counter()
        self.named: list[tuple[str, RejectedFile]] = []

    def add(self, name: str, rejection: RejectedFile) -> None:
        self.counts[rejection.reason] += 1
        if len(self.named) < MAX_NAMED_REJECTIONS:
            self.named.append((name, rejection))

    def add_reason(self, name: str, reason: str, detail: str) -> None:
        """``add``, making the rejection only if it is named."""
        self.counts[reason] += 1
        if len(self.named) < MAX_NAMED_REJECTIONS:
            self.named.append((name, RejectedFile(reason, detail)))


def list_rank_files(
    directory: Path,
    suffix: str,
    limit: int,
    file_cost: int,
    max_file_bytes: int,
    trusted: frozenset[int] | None,
    first: frozenset[int],
    holds_lock: Callable[[str, int], bool],
    rejections: Rejections,
) -> list[Listed]:
    """At most ``limit`` files of ``directory`` named ``rank-*<suffix>``, in the order to look at them; the files left
    out go to ``rejections``. ``trusted``: the uids whose files are served (None: anyone's); ``first``: the uids whose
    files come first; ``holds_lock(name, uid)``: whether a live process of ``uid`` holds the lock of that rank file;
    ``file_cost``: what a file costs its user, beyond its bytes, when users take turns."""
    now = time.time()
    kept: dict[int, list[tuple[tuple, str, os.stat_result]]] = {}  # by uid; FIRST: the users of ``first``
    for name, info in _entries(directory, suffix):
        if not stat.S_ISREG(info.st_mode):
            link = stat.S_ISLNK(info.st_mode)
            rejections.add_reason(name, "not_regular", "a symbolic link" if link else "not a regular file")
        elif trusted is not None and info.st_uid not in trusted:
            detail = f"owned by uid {info.st_uid}, whom the reader does not trust"
            rejections.add_reason(name, "untrusted_owner", detail)
        elif info.st_size > max_file_bytes:
            detail = f"{info.st_size} bytes, more than the {max_file_bytes} allowed"
            rejections.add_reason(name, "too_large", detail)
        else:
            files = kept.setdefault(FIRST if info.st_uid in first else info.st_uid, [])
            files.append((_order(name, info.st_mtime, now), name, info))
            if len(files) >= 2 * limit:
                _keep_first(files, limit, rejections)
    for files in kept.values():
        _keep_first(files, limit, rejections)
    ordered = [Listed(name, info) for _, name, info in kept.pop(FIRST, [])]
    live: dict[int, list[Listed]] = {}
    rest: dict[int, list[Listed]] = {}
    for uid, files in kept.items():
        for _, name, info in files:
            (live if holds_lock(name, uid) else rest).setdefault(uid, []).append(Listed(name, info))
    ordered += _in_turns(live, file_cost) + _in_turns(rest, file_cost)
    for name, _ in ordered[limit:]:
        rejections.add(name, rejections.over_budget)
    return ordered[:limit]


def _entries(directory: Path, suffix: str) -> Iterator[tuple[str, os.stat_result]]:
    """The name and lstat of every ``rank-*<suffix>`` entry, one at a time."""
    try:
        with os.scandir(directory) as entries:
            for entry in entries:
                if entry.name.startswith(PREFIX) and entry.name.endswith(suffix):
                    try:
                        info = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue  # gone since the listing
                    yield entry.name, info
    except OSError:
        return


def _keep_first(files: list, limit: int, rejections: Rejections) -> None:
    files.sort()
    for _, name, _ in files[limit:]:
        rejections.add(name, rejections.over_budget)
    del files[limit:]


def _in_turns(files_of: dict[int, list[Listed]], file_cost: int) -> list[Listed]:
    """The files of several users, each user's in its order, the users taking turns: next, always the next file of the
    user whose files taken so far cost the least (their bytes, and ``file_cost`` each)."""
    turns = [(0, uid, iter(files)) for uid, files in files_of.items()]
    heapq.heapify(turns)
    taken = []
    while turns:
        cost, uid, files = turns[0]
        listed = next(files, None)
        if listed is None:
            heapq.heappop(turns)
            continue
        taken.append(listed)
        heapq.heapreplace(turns, (cost + listed.info.st_size + file_cost, uid, files))
    return taken


def _order(name: str, mtime: float, now: float):
    """Live runs' files first, in the order of their runs, then ranks (numerically where ranks are numbers), then the
    others, the most recent first; from their names and modification times. A time further ahead of now than a live
    rank's could be (a clock set back since it was written) says nothing of when: such files come last."""
    rank, _, run = name[len(PREFIX) : -len(DATA_SUFFIX)].partition(".")
    if abs(now - mtime) < FRESH_SECONDS:
        return 0, 0.0, run, rank_order(rank)
    if mtime > now:
        return 2, 0.0, run, rank_order(rank)
    return 1, -mtime, run, rank_order(rank)
