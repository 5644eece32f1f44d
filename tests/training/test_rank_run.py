"""A rank's run across its processes (``rank_run``): the arithmetic of going on from an earlier process, on a fake
clock, and the earlier process read back from a real spool file."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from neuron_exporter.node.spool_format import MAX_MARKS, RankMeta, RejectedFile, RunHistory
from neuron_exporter.node.spool_reader import read_rank_file
from neuron_exporter.node.spool_writer import write_rank_file
from neuron_exporter.training.phases.resume_points import restored_step
from neuron_exporter.training.rank_run import (
    OPTIMIZER,
    SCHEDULER,
    EarlierProcess,
    RankRun,
    read_earlier,
    thinned,
    useful_at,
)
from neuron_exporter.training.time_phases import PHASES, RECOVERY, STARTUP, STEP, TimePhases

LABELS = {"rank": "3", "run_id": "torchrun-7", "local_rank": "3"}


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def a_run(process_start: float = 1000.0) -> tuple[RankRun, TimePhases, Clock]:
    clock = Clock()
    ledger = TimePhases(clock.now, clock)
    return RankRun(ledger, process_start), ledger, clock


def train(ledger: TimePhases, clock: Clock, steps: int, seconds: float = 1.0) -> None:
    for _ in range(steps):
        clock.now += seconds
        ledger.optimizer_stepped()


def earlier(step: int, marks, step_seconds: float, counted: float, ended: float, **kwargs) -> EarlierProcess:
    totals = {**dict.fromkeys(PHASES, 0.0), STEP: step_seconds, STARTUP: 5.0}
    history = RunHistory(step, counted, kwargs.pop("stepped", True), tuple(marks))
    fields = {"lost": 0.0, "restarts": 0.0, "finished": False, "started": 900.0, "ended": ended, **kwargs}
    return EarlierProcess(totals, history=history, **fields)


def test_useful_seconds_between_marks_are_interpolated_and_exact_at_a_mark():
    marks = [(0, 0.0, 0), (10, 10.0, 1), (30, 50.0, 0)]
    assert useful_at(marks, 10) == 10.0
    assert useful_at(marks, 20) == 30.0
    assert useful_at(marks, 40) == 50.0  # past the last: the last
    assert useful_at([(5, 7.0, 0)], 2) == 7.0  # before the history began: where it began


def test_thinning_keeps_the_first_the_newest_and_the_saves_and_thins_old_history_most():
    marks = [(step, float(step), int(step % 100 == 0)) for step in range(0, 1000, 5)]
    kept = thinned(marks)
    assert len(kept) == MAX_MARKS
    assert kept[0] == marks[0] and kept[-8:] == marks[-8:]
    assert {mark for mark in marks if mark[2]} <= set(kept)
    gaps = [b[0] - a[0] for a, b in zip(kept, kept[1:], strict=False)]
    assert gaps[0] > gaps[-10]  # coarser with age


def test_a_crashed_process_is_a_restart_with_its_recovery_its_last_stretch_and_its_steps_past_the_resume():
    run, ledger, clock = a_run(process_start=1000.0)
    # The earlier process: 25 steps of 1 s (useful 25 s), marks at 0, 10 (a save) and 20; it counted 35 s of its
    # life (5 s start-up, 25 s of steps, ...) from 900 s, wrote last at 940 s (its last 5 s not counted: the step it
    # died in), and this process started at 1000 s.
    run.take_up(LABELS, earlier(25, [(0, 0.0, 0), (10, 10.0, 1), (20, 20.0, 0)], 25.0, counted=35.0, ended=940.0))
    assert run.restarts == 1
    assert run.carried[RECOVERY] == 60.0  # 940 s -> 1000 s
    assert run.carried[STEP] == 30.0  # its 25 s and the 5 s it died in
    run.restored(OPTIMIZER, 20)  # AdamW's state says 20 steps
    train(ledger, clock, 1)
    run.sample()
    assert run.base == 20
    assert run.lost_seconds == pytest.approx(5.0 + 5.0)  # steps 21..25, and the step it died in
    own, steps = ledger.progress()
    history = run.history(own, steps)
    assert history.step == 21 and history.stepped
    assert history.marks[:3] == ((0, 0.0, 0), (10, 10.0, 1), (20, 20.0, 0))  # the run's history up to the resume
    assert history.marks[-1] == (21, 20.0, 0)  # this process's first step is its start-up


def test_the_optimizer_s_restored_step_wins_over_the_scheduler_s_and_a_save_is_the_fallback():
    marks = [(0, 0.0, 0), (10, 10.0, 1), (20, 20.0, 0)]
    for restored, base in (({SCHEDULER: 15, OPTIMIZER: 20}, 20), ({SCHEDULER: 15}, 15), ({}, 10)):
        run, ledger, clock = a_run()
        run.take_up(LABELS, earlier(25, marks, 25.0, counted=35.0, ended=940.0))
        for kind, step in restored.items():
            run.restored(kind, step)
        train(ledger, clock, 1)
        run.sample()
        assert run.base == base
        assert run.lost_seconds == pytest.approx(25.0 - base + 5.0)


def test_a_process_that_ended_cleanly_is_no_restart_and_one_that_never_stepped_loses_no_work():
    run, ledger, clock = a_run()
    run.take_up(LABELS, earlier(25, [(0, 0.0, 0)], 25.0, counted=40.0, ended=940.0, finished=True))
    assert run.restarts == 0 and run.carried[RECOVERY] == 60.0
    run, ledger, clock = a_run()
    run.take_up(LABELS, earlier(0, [], 0.0, counted=30.0, ended=940.0, stepped=False, restarts=2.0, lost=3.0))
    assert run.restarts == 3 and run.carried[STARTUP] == 5.0 + 10.0  # its last stretch was start-up
    train(ledger, clock, 1)
    run.sample()
    assert run.lost_seconds == 3.0  # what earlier restarts lost, and nothing more


def test_a_first_process_counts_from_zero_and_its_marks_start_at_the_restored_step():
    run, ledger, clock = a_run()
    run.take_up(LABELS, None)
    run.restored(OPTIMIZER, 500)  # resumed from another run's checkpoint
    train(ledger, clock, 3)
    run.sample()
    assert (run.restarts, run.lost_seconds, run.carried[RECOVERY]) == (0, 0, 0)
    assert run.marks == [(500, 0.0, 0), (503, 2.0, 0)]  # the first step was start-up


def test_a_later_restart_rolls_back_past_an_earlier_one_without_counting_its_loss_twice():
    # Process 1: steps 0..25 (useful 25 s); process 2 resumed at 20 (lost 5 s), made 10 steps to 30 (useful 30 s).
    run2, ledger2, clock2 = a_run()
    run2.take_up(LABELS, earlier(25, [(0, 0.0, 0), (20, 20.0, 1)], 25.0, counted=30.0, ended=930.0))
    run2.restored(OPTIMIZER, 20)
    train(ledger2, clock2, 10)
    run2.sample()
    assert run2.lost_seconds == pytest.approx(5.0)
    own, steps = ledger2.progress()
    history = run2.history(own, steps)
    totals = run2.totals(own)
    # Process 3 resumes at 20 again: process 2's 10 steps are lost, not process 1's 5 s again.
    run3, ledger3, clock3 = a_run()
    before = EarlierProcess(totals, run2.lost_seconds, run2.restarts, False, 1000.0, 1000.0 + history.counted, history)
    run3.take_up(LABELS, before)
    run3.restored(OPTIMIZER, 20)
    train(ledger3, clock3, 1)
    run3.sample()
    assert run3.lost_seconds == pytest.approx(5.0 + 9.0)  # process 2's first step was start-up
    assert run3.restarts == 2


def test_restored_steps_are_read_from_numbers_and_cpu_tensors_only():
    torch = pytest.importorskip("torch")
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    for _ in range(3):
        model(torch.ones(2)).sum().backward()
        optimizer.step()
    assert restored_step(OPTIMIZER, optimizer.state_dict()) == 3
    assert restored_step(OPTIMIZER, torch.optim.SGD(model.parameters()).state_dict()) is None
    assert restored_step(OPTIMIZER, {"state": {0: {"step": torch.tensor([1.0, 2.0])}}}) is None
    assert restored_step(OPTIMIZER, {"state": {0: {"step": True}}}) is None
    assert restored_step(SCHEDULER, {"last_epoch": 7}) == 7
    assert restored_step(SCHEDULER, ["not", "a", "state"]) is None


def write_report(spool, pid: int, history: RunHistory | None, exposition: bytes, finished=False):
    meta = RankMeta("3", "3", pid, 900.0, finished, None, LABELS["run_id"], history)
    return write_rank_file(spool, meta, exposition)


EXPOSITION = (
    b"# HELP training_time_seconds_total Wall time\n"
    b"# TYPE training_time_seconds_total counter\n"
    b'training_time_seconds_total{local_rank="3",phase="step",rank="3",run_id="torchrun-7"} 25.0\n'
    b'training_time_seconds_total{local_rank="3",phase="recovery",rank="3",run_id="torchrun-7"} 4.0\n'
    b"# HELP training_lost_seconds_total Lost\n"
    b"# TYPE training_lost_seconds_total counter\n"
    b'training_lost_seconds_total{local_rank="3",rank="3",run_id="torchrun-7"} 2.5\n'
    b"# HELP training_restarts_total Restarts\n"
    b"# TYPE training_restarts_total counter\n"
    b'training_restarts_total{local_rank="3",rank="3",run_id="torchrun-7"} 1.0\n'
)


def dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_the_earlier_process_is_read_back_from_its_spool_file_with_its_history(tmp_path):
    history = RunHistory(25, 35.0, True, ((0, 0.0, 0), (10, 10.0, 1)))
    path = write_report(tmp_path, os.getpid(), history, EXPOSITION)
    from neuron_exporter.node.spool_writer import release_rank_lock

    release_rank_lock(tmp_path, "3", LABELS["run_id"])  # as a dead process's lock is
    header = json.loads(path.read_bytes().partition(b"\n")[0])
    header["pid"] = dead_pid()
    path.write_bytes(json.dumps(header).encode() + b"\n" + EXPOSITION)
    found = read_earlier(str(tmp_path), LABELS)
    assert found is not None and found.history == history
    assert (found.totals[STEP], found.totals[RECOVERY], found.lost, found.restarts) == (25.0, 4.0, 2.5, 1.0)
    assert found.ended == pytest.approx(path.stat().st_mtime)


def test_a_live_earlier_process_or_none_is_not_gone_on_from(tmp_path):
    assert read_earlier(str(tmp_path), LABELS) is None
    write_report(tmp_path, os.getpid(), None, EXPOSITION)  # this process holds the rank's lock
    assert read_earlier(str(tmp_path), LABELS) is None


@pytest.mark.parametrize(
    "history",
    [
        [],
        {"step": -1, "counted": 1.0, "stepped": True},
        {"step": 1, "counted": float("inf"), "stepped": True},
        {"step": 1, "counted": 1.0, "stepped": "yes"},
        {"step": 1, "counted": 1.0, "stepped": True, "marks": [[1, 2.0]]},
        {"step": 1, "counted": 1.0, "stepped": True, "marks": [[1, 2.0, 0]] * (MAX_MARKS + 1)},
        {"step": 1, "counted": 1.0, "stepped": True, "marks": [[1, -2.0, 0]]},
    ],
)
def test_a_bad_history_is_a_bad_header(tmp_path, history):
    header = {"format": 2, "rank": "3", "local_rank": "3", "pid": 1, "start_time": 1.0, "run_id": LABELS["run_id"]}
    path = tmp_path / "rank-3.torchrun-7.prom"
    path.write_bytes(json.dumps({**header, "history": history}).encode() + b"\n" + EXPOSITION)
    with pytest.raises(RejectedFile) as rejected:
        read_rank_file(path)
    assert rejected.value.reason == "bad_header" and "history" in str(rejected.value)


def test_a_save_before_the_earlier_process_is_taken_up_is_settled_again_against_it():
    run, ledger, clock = a_run()
    run.restored(OPTIMIZER, 20)
    run.saving()  # a save within moments of attach(), before the spool thread looked for the earlier process
    run.take_up(LABELS, earlier(25, [(0, 0.0, 0), (20, 20.0, 1)], 25.0, counted=35.0, ended=940.0))
    train(ledger, clock, 1)
    run.sample()
    assert run.base == 20 and run.lost_seconds == pytest.approx(5.0 + 5.0)
