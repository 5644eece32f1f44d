"""A rank's run across its processes: a process that its launcher started again (torchrun's ``--max-restarts``, a
container's restart, a requeue on the same machine) goes on from what the rank's earlier process of the run counted,
so that within the run the rank's ``training_time_seconds_total``, ``training_lost_seconds_total`` and
``training_restarts_total`` never go back.

The earlier process's last report is the rank's spool file (``rank-R.J.prom``), which this process replaces at its
first write; before that, the spool thread reads it once (``read_earlier``, ``take_up``): a file of this user whose
process has ended. From it:

- its counters, as of its last write (every ``spool_interval_seconds``; exact at a clean end);
- a restart, if it ended without finishing;
- ``recovery``: from its last sign of life (the last write of its file) to this process's start;
- its last stretch, which its phases had not counted when it last wrote (the step it died in, or the collective it
  hung in until the launcher killed it): ``step`` and work lost, or ``startup`` if it never made a step;
- the work done again (``training_lost_seconds_total``): its ``step`` seconds from the step this process resumed from
  to its end, by the marks of progress it wrote in its header (``RunHistory``: the run's step and the useful step
  seconds so far, every write and at every checkpoint save, thinned to at most ``MAX_MARKS``; between two marks, the
  seconds are interpolated).

The step resumed from, known at this process's first optimizer step, without user code: an optimizer's restored
state (Adam, AdamW and the like keep a step count), else an LR scheduler's restored ``last_epoch``, else the last
checkpoint save the earlier process saw, else the beginning of the run (it started over). The run's step is this
process's optimizer steps on its training thread from the step it resumed from.
"""

from __future__ import annotations

import logging
import math
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from ..catalogue import TRAINING_LOST, TRAINING_RESTARTS, TRAINING_TIME
from ..node.spool_format import DATA_SUFFIX, MAX_MARKS, MAX_SECONDS, RunHistory, file_stem
from ..node.spool_reader import lock_holder_alive, read_rank_file
from .time_phases import PHASES, RECOVERY, STARTUP, STEP, TimePhases

log = logging.getLogger("neuron_exporter")
RECENT_MARKS = 8  # the newest marks are never thinned: a restart most often resumes near the end
OPTIMIZER, SCHEDULER = "optimizer", "scheduler"
Mark = tuple[int, float, int]  # run step, useful step seconds of the rank so far, 1 at a checkpoint save


@dataclass(frozen=True)
class EarlierProcess:
    """The last report of the rank's earlier process in this run."""

    totals: dict[str, float]  # training_time_seconds_total by phase
    lost: float
    restarts: float
    finished: bool
    started: float  # unix seconds
    ended: float  # its file's last write
    history: RunHistory | None  # None from an exporter that wrote none


def read_earlier(spool_dir: str, labels: Mapping[str, str]) -> EarlierProcess | None:
    """The rank's earlier process's last report in ``spool_dir``: one of this user's, whose process has ended; None
    if there is none. ``OSError``, ``ValueError`` (``RejectedFile``) for one that cannot be read or is not valid."""
    own = frozenset({os.geteuid()})
    report = read_rank_file(Path(spool_dir) / (file_stem(labels["rank"], labels["run_id"]) + DATA_SUFFIX), trusted=own)
    if report is None or report.meta.pid == os.getpid():
        return None
    if lock_holder_alive(report.lock_path, report.meta, own):
        return None  # it still runs: this process cannot report as the rank (the spool says so)
    totals, lost, restarts = _counters(report.exposition)
    meta = report.meta
    return EarlierProcess(totals, lost, restarts, meta.finished, meta.start_time, report.mtime, meta.history)


def _counters(exposition: bytes) -> tuple[dict[str, float], float, float]:
    names = (TRAINING_TIME.name, TRAINING_LOST.name, TRAINING_RESTARTS.name)
    lines = [line for line in exposition.decode("utf-8").splitlines() if line.startswith(names)]
    totals, lost, restarts = dict.fromkeys(PHASES, 0.0), 0.0, 0.0
    for family in text_string_to_metric_families("\n".join(lines) + "\n"):
        for sample in family.samples:
            value = sample.value
            if not (math.isfinite(value) and 0 <= value <= MAX_SECONDS):
                raise ValueError(f"{sample.name}: {value} is not a count this exporter writes")
            if sample.name == TRAINING_TIME.name and sample.labels.get("phase") in totals:
                totals[sample.labels["phase"]] = value
            elif sample.name == TRAINING_LOST.name:
                lost = value
            elif sample.name == TRAINING_RESTARTS.name:
                restarts = value
    return totals, lost, restarts


def useful_at(marks: list[Mark], step: int) -> float:
    """The useful step seconds at the run's ``step``, by ``marks`` (sorted by step): interpolated between the two
    around it; before the first, the first's (the history starts there)."""
    below = None
    for mark in marks:
        if mark[0] <= step:
            below = mark
            continue
        if below is None:
            return mark[1]
        share = (step - below[0]) / (mark[0] - below[0])
        return below[1] + share * (mark[1] - below[1])
    return below[1] if below is not None else 0.0


def thinned(marks: list[Mark]) -> list[Mark]:
    """At most ``MAX_MARKS`` marks: the first and the ``RECENT_MARKS`` newest stay; of the others, the one whose
    neighbours are closest for its age goes, a checkpoint save's last (older history is kept coarser)."""
    marks = list(marks)
    while len(marks) > MAX_MARKS:
        newest = marks[-1][0]
        costs = {
            index: (marks[index][2], (marks[index + 1][0] - marks[index - 1][0]) / (newest - marks[index][0] + 1))
            for index in range(1, len(marks) - RECENT_MARKS)
        }
        del marks[min(costs, key=costs.__getitem__)]
    return marks


class RankRun:
    """The rank's run as this process goes on with it: what the earlier processes counted, and this one's progress.
    The spool thread takes the earlier process up and samples progress; the training thread tells of restored
    optimizers and schedulers and of checkpoint saves."""

    def __init__(self, ledger: TimePhases, process_start: float):
        self.ledger = ledger
        self.process_start = process_start  # unix seconds
        self._lock = threading.Lock()  # a forked child gets a new RankRun (process_run)
        self.taken_for: tuple[str, str] | None = None  # the (rank, run) the earlier process was looked for
        self.wrote = False  # this process reported as the rank: the rank is its own from now on
        self.carried = dict.fromkeys(PHASES, 0.0)  # the earlier processes', recovery and the last stretch included
        self.carried_lost = 0.0
        self.restarts = 0.0
        self.lost = 0.0  # of the earlier process, found by this one
        self.earlier: EarlierProcess | None = None
        self._tail = 0.0  # the earlier process's last stretch, counted as step (and lost)
        self._restored: dict[str, int] = {}  # kind -> the run's step at this process's step 0
        self.base: int | None = None  # the run's step this process started from, once known
        self.marks: list[Mark] = []

    # -- the spool thread ---------------------------------------------------------------------------------------
    def take_up(self, labels: Mapping[str, str], earlier: EarlierProcess | None) -> None:
        """Go on from ``earlier``, the last report of the rank ``labels`` name (None: the rank starts here)."""
        with self._lock:
            self.taken_for = (labels["rank"], labels["run_id"])
            self.carried, self.carried_lost, self.restarts, self._tail = dict.fromkeys(PHASES, 0.0), 0.0, 0.0, 0.0
            self.earlier = earlier
            self.base, self.marks, self.lost = None, [], 0.0  # settled again, against it (a save may have come first)
            if earlier is None:
                return
            self.carried.update(earlier.totals)
            self.carried_lost = earlier.lost
            self.restarts = earlier.restarts + (0 if earlier.finished else 1)
            self.carried[RECOVERY] += max(0.0, self.process_start - earlier.ended)
            history = earlier.history
            if history is not None:
                counted_until = earlier.started + history.counted
                tail = max(0.0, earlier.ended - counted_until)
                if history.stepped:
                    self._tail = tail
                    self.carried[STEP] += tail
                else:
                    self.carried[STARTUP] += tail

    def sample(self) -> None:
        """A mark of progress, once this process has made a step (the step it resumed from is known then)."""
        steps, step_seconds = self._progress()
        with self._lock:
            if self.base is None:
                if not steps:
                    return
                self._settle()
            self._mark(self.base + steps, step_seconds, 0)  # type: ignore[operator]

    def history(self, own: Mapping[str, float], steps: int) -> RunHistory:
        """What the next process of the rank needs of this one, for the header of the report that ``own`` and
        ``steps`` (this process's, from ``ledger.progress``) go in."""
        with self._lock:
            if self.base is None and steps:
                self._settle()
            base = self.base if self.base is not None else self._resumed_from()
            return RunHistory(base + steps, sum(own.values()), steps > 0, tuple(self.marks))

    # -- the training thread ------------------------------------------------------------------------------------
    def restored(self, kind: str, step: int) -> None:
        """An optimizer or LR scheduler (``kind``) was loaded with a state that had made ``step`` steps."""
        self._restored[kind] = step - self.ledger.steps

    def saving(self) -> None:
        """A checkpoint save begins: a mark the next process may resume from."""
        steps, step_seconds = self._progress()
        with self._lock:
            if self.base is None:
                self._settle()
            self._mark(self.base + steps, step_seconds, 1)  # type: ignore[operator]

    # -- reading ------------------------------------------------------------------------------------------------
    def totals(self, own: Mapping[str, float]) -> dict[str, float]:
        """The rank's phases in the run: the earlier processes' and this one's ``own``."""
        carried = self.carried
        return {phase: carried[phase] + own[phase] for phase in PHASES}

    @property
    def lost_seconds(self) -> float:
        return self.carried_lost + self.lost

    # -- under the lock -----------------------------------------------------------------------------------------
    def _progress(self) -> tuple[int, float]:
        own, steps = self.ledger.progress()
        return steps, own[STEP]

    def _resumed_from(self) -> int:
        for kind in (OPTIMIZER, SCHEDULER):
            if kind in self._restored:
                return max(0, self._restored[kind])
        history = self.earlier.history if self.earlier is not None else None
        saves = [mark[0] for mark in history.marks if mark[2]] if history is not None else []
        return saves[-1] if saves else 0

    def _settle(self) -> None:
        """The step this process resumed from is known: the work the earlier process did past it is lost, and its
        marks before it are the run's history."""
        self.base = base = self._resumed_from()
        history = self.earlier.history if self.earlier is not None else None
        marks: list[Mark] = []
        if history is not None:
            end = self.earlier.totals[STEP] - self.earlier.lost  # type: ignore[union-attr]
            marks = [mark for mark in history.marks if mark[0] < history.step] + [(history.step, end, 0)]
            self.lost = self._tail + (max(0.0, end - useful_at(marks, base)) if base < history.step else 0.0)
        useful = self.carried[STEP] - self.carried_lost - self.lost  # at the step resumed from
        self.marks = [mark for mark in marks if mark[0] < base] + [(base, round(useful, 3), 0)]

    def _mark(self, step: int, own_step_seconds: float, save: int) -> None:
        useful = self.carried[STEP] + own_step_seconds - self.carried_lost - self.lost
        marks = self.marks
        if marks and marks[-1][0] >= step:
            if marks[-1][0] == step and save:
                marks[-1] = (step, marks[-1][1], 1)
            return
        marks.append((step, round(useful, 3), save))
        if len(marks) > MAX_MARKS:
            self.marks = thinned(marks)


_process_run: RankRun | None = None


def process_run(ledger: TimePhases, process_start: float) -> RankRun:
    """This process's run of its rank, over ``ledger``: made at the first ``attach()`` and kept by the next ones (the
    earlier process is taken up once); a forked child gets its own."""
    global _process_run
    if _process_run is None or _process_run.ledger is not ledger:
        _process_run = RankRun(ledger, process_start)
    return _process_run


def _after_fork_in_child() -> None:
    global _process_run
    _process_run = None


os.register_at_fork(after_in_child=_after_fork_in_child)
