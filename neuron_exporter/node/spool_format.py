"""The spool's file format: how every rank of a machine hands its metrics to the node endpoint (deploy/PROTOCOL.md).

Each rank of each run has ``rank-<rank>.<run>.prom`` in the spool directory: one JSON line of metadata (``RankMeta``),
then its full exposition; beside it its diagnosis (``.diagnosis.json``) and its lock (``.lock``). This module says
what the names and the header are, and checks a header read from a file: wrong types or ranges are rejected with a
reason, never served. The directory's trust is ``spool_dir``, the training side's writing ``spool_writer``, the node
endpoint's reading ``spool_reader`` and the removal of what is left behind ``spool_expiry``.
"""

from __future__ import annotations

import functools
import hashlib
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from .. import run_identity
from .exposition_check import CheckedExposition

FORMAT_VERSION = 2  # 1: before run_id (0.1); such files are left alone
PREFIX = "rank-"
DATA_SUFFIX = ".prom"
LOCK_SUFFIX = ".lock"
DIAGNOSIS_SUFFIX = ".diagnosis.json"
TEMP_SUFFIX = ".tmp"
SUFFIXES = (DATA_SUFFIX, LOCK_SUFFIX, DIAGNOSIS_SUFFIX)
_NAME_SAFE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
MAX_NAME_PART = 100  # two parts and the affixes stay well under a file name's 255 bytes
RANK_LABEL = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
MAX_HEADER_BYTES = 4096
MAX_PID = 2**31 - 1
MAX_TIME = 2.0**34  # unix seconds, year 2514: anything later is not a time this file could have been written
MAX_MARKS = 64  # of a history: its JSON stays well inside the header's bytes
MAX_STEP = 2**53
MAX_SECONDS = 2.0**40
DEFAULT_SPOOL_MODE = "private"


class RejectedFile(ValueError):
    """A file in the spool directory that is not served; ``reason`` is a short class for the metric."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason


@dataclass(frozen=True)
class RunHistory:
    """What the next process of the rank needs of this one to go on from it (``training.rank_run``): the run's step
    it reached, the seconds its own phases counted, whether it made an optimizer step, and marks of its progress:
    (run step, useful step seconds of the rank so far, 1 if a checkpoint save began there, else 0)."""

    step: int
    counted: float
    stepped: bool
    marks: tuple[tuple[int, float, int], ...] = ()

    @classmethod
    def of(cls, value: object) -> RunHistory:
        """A history from its JSON; ``ValueError`` naming what is wrong."""
        if isinstance(value, RunHistory):
            return value
        if not isinstance(value, Mapping):
            raise ValueError("history: expected an object")
        marks = value.get("marks", ())
        if not isinstance(marks, (list, tuple)) or len(marks) > MAX_MARKS:
            raise ValueError(f"history.marks: expected at most {MAX_MARKS} marks")
        checked = []
        for mark in marks:
            if not isinstance(mark, (list, tuple)) or len(mark) != 3:
                raise ValueError("history.marks: expected [step, seconds, save] each")
            step, seconds, save = mark
            checked.append((
                _checked(step, "history.marks step", int, 0, MAX_STEP),
                _checked(seconds, "history.marks seconds", float, 0, MAX_SECONDS),
                _checked(save, "history.marks save", int, 0, 1),
            ))  # fmt: skip
        stepped = value.get("stepped")
        if not isinstance(stepped, bool):
            raise ValueError("history.stepped: expected true or false")
        return cls(
            _checked(value.get("step"), "history.step", int, 0, MAX_STEP),
            _checked(value.get("counted"), "history.counted", float, 0, MAX_SECONDS),
            stepped,
            tuple(checked),
        )


@dataclass(frozen=True)
class RankMeta:
    rank: str
    local_rank: str
    pid: int
    start_time: float  # the process's creation time (unix seconds): tells a reused pid from the original
    finished: bool = False  # the last report of a rank that ended cleanly (detach)
    last_step_time: float | None = None  # unix time of the rank's last step; None: use the file's age
    run_id: str = ""  # the run the rank belongs to (run_identity); "" is taken for this process's run
    history: RunHistory | None = None  # for the rank's next process, if this one ends without finishing

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
            None if meta.get("history") is None else RunHistory.of(meta["history"]),
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
    return _checked(meta.get(key), key, kind, low, high)


def _checked(value: object, key: str, kind: type, low: float, high: float):
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


def split_name(name: str) -> tuple[str, str, str] | None:
    """(stem, escaped rank, suffix) of a rank's file name (data, lock or diagnosis), as ``file_stem`` makes them;
    None for any other name."""
    if not name.startswith(PREFIX):
        return None
    for suffix in SUFFIXES:
        if name.endswith(suffix):
            stem = name[: -len(suffix)]
            rank, dot, run = stem[len(PREFIX) :].partition(".")
            return (stem, rank, suffix) if dot and rank and run and "." not in run else None
    return None
