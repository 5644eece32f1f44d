"""The time-phases ledger on a clock the test moves: the phases partition the training thread's time, nested phases
count once (compile wherever it happens, else the outermost), and what is served never goes backwards."""

from __future__ import annotations

import random
import threading

from neuron_exporter.training.time_phases import (
    CHECKPOINT,
    COMPILE,
    DATA,
    HOST_SYNC,
    OTHER,
    PHASES,
    STARTUP,
    STEP,
    TimePhases,
)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def ledger(started_ago: float = 2.0) -> tuple[TimePhases, Clock]:
    clock = Clock()
    return TimePhases(clock.now - started_ago, clock), clock


def within(phase: str, seconds: float, phases: TimePhases, clock: Clock) -> None:
    assert phases.enter(phase)
    clock.advance(seconds)
    phases.leave()


def test_a_training_run_is_partitioned_into_its_phases():
    phases, clock = ledger(started_ago=2.0)  # two seconds of start-up before attach()
    within(CHECKPOINT, 1.0, phases, clock)  # a checkpoint loaded before training
    clock.advance(0.5)
    phases.optimizer_created()
    for _ in range(3):
        within(DATA, 0.25, phases, clock)
        clock.advance(1.0)  # forward and backward
        within(HOST_SYNC, 0.125, phases, clock)
        phases.optimizer_stepped()
    within(CHECKPOINT, 2.0, phases, clock)
    clock.advance(0.5)  # an evaluation at the end
    phases.finish()
    assert phases.read() == {
        STARTUP: 2.5,
        CHECKPOINT: 3.0,
        DATA: 0.75,
        HOST_SYNC: 0.375,
        STEP: 3.0,
        COMPILE: 0.0,
        OTHER: 0.5,
    }


def test_compiling_is_compile_wherever_it_happens_and_counts_once():
    phases, clock = ledger(started_ago=0.0)
    phases.optimizer_created()
    # A host read whose graph compiled for 3 of its 4 seconds (told afterwards, as torch_xla's compilations are).
    assert phases.enter(HOST_SYNC)
    began = clock.now
    clock.advance(4.0)
    phases.compiled(3.0, began)
    phases.leave()
    # dynamo compiling for 2 seconds, in which a device compiled too (counted once), then a step marker that
    # compiled 0.5 s in the step itself.
    phases.compile_started()
    began = clock.now
    clock.advance(2.0)
    phases.compiled(1.5, began)
    phases.compile_ended()
    began = clock.now
    clock.advance(1.0)
    phases.compiled(0.5, began)
    phases.optimizer_stepped()
    assert phases.read() == {**dict.fromkeys(PHASES, 0.0), HOST_SYNC: 1.0, COMPILE: 5.5, STEP: 0.5}


def test_a_compilation_told_for_longer_than_its_call_took_counts_the_call_only():
    phases, clock = ledger(started_ago=0.0)
    phases.optimizer_created()
    began = clock.now
    clock.advance(1.0)
    phases.compiled(5.0, began)  # more than the call took: a clock of another kind, or another thread's
    phases.optimizer_stepped()
    assert phases.read()[COMPILE] == 1.0 and phases.read()[STEP] == 0.0


def test_nested_phases_count_in_the_outermost():
    phases, clock = ledger(started_ago=0.0)
    assert phases.enter(CHECKPOINT)  # torch.save of device tensors reads them to the host
    within(HOST_SYNC, 1.0, phases, clock)
    clock.advance(1.0)
    phases.leave()
    phases.optimizer_stepped()
    assert phases.read()[CHECKPOINT] == 2.0 and phases.read()[HOST_SYNC] == 0.0


def test_other_threads_are_not_the_training_thread():
    phases, clock = ledger(started_ago=0.0)
    entered = []
    worker = threading.Thread(target=lambda: entered.append(phases.enter(DATA)))
    worker.start()
    worker.join()
    assert entered == [False]
    # An optimizer that steps on another thread makes that thread the training thread.
    stepper = threading.Thread(target=lambda: (phases.optimizer_stepped(), entered.append(phases.enter(DATA))))
    stepper.start()
    stepper.join()
    assert entered == [False, True] and not phases.enter(DATA)


def test_before_any_optimizer_the_time_so_far_is_startup_and_a_process_that_never_trains_ends_in_it():
    phases, clock = ledger(started_ago=1.0)
    clock.advance(1.0)
    assert phases.read()[STARTUP] == 2.0
    clock.advance(1.0)
    phases.finish()
    clock.advance(5.0)
    assert phases.read() == {**dict.fromkeys(PHASES, 0.0), STARTUP: 3.0}
    assert not phases.enter(DATA)  # nothing is counted after the end


def test_served_totals_never_go_backwards_and_sum_to_the_wall_time_at_each_step():
    rng = random.Random(7)
    for _ in range(200):
        phases, clock = ledger(started_ago=rng.random())
        origin = clock.now - (phases.read()[STARTUP])
        last = phases.read()
        depth = 0
        compiling = 0
        for _ in range(60):
            event = rng.choice(
                ("enter", "leave", "compile_start", "compile_end", "compiled", "device_call", "created", "step")
            )
            clock.advance(rng.random())
            if event == "enter" and depth < 3:
                depth += phases.enter(rng.choice((DATA, HOST_SYNC, CHECKPOINT)))
            elif event == "leave" and depth:
                phases.leave()
                depth -= 1
            elif event == "compile_start" and compiling < 2:
                phases.compile_started()
                compiling += 1
            elif event == "compile_end" and compiling:
                phases.compile_ended()
                compiling -= 1
            elif event == "compiled":
                phases.compiled(rng.random() * 2, clock.now - rng.random() * 2)
            elif event == "device_call":  # a step marker that compiles, seen by reads while it runs
                call = seen = clock.now
                for _ in range(rng.randrange(4)):
                    clock.advance(rng.random())
                    phases.device_compiling(threading.get_ident(), call, seen, clock.now)
                    seen = clock.now
                    now = phases.read()
                    assert all(now[phase] >= last[phase] - 1e-12 for phase in PHASES), (last, now)
                    last = now
                clock.advance(rng.random())
                phases.compiled(rng.random() * (clock.now - call) * 1.2, call)
                phases.device_compiling(threading.get_ident(), call, seen, clock.now)  # a read that raced the end
            elif event == "created":
                phases.optimizer_created()
            elif event == "step" and not depth and not compiling:
                phases.optimizer_stepped()
                assert abs(sum(phases.read().values()) - (clock.now - origin)) < 1e-9
            now = phases.read()
            assert all(now[phase] >= last[phase] - 1e-12 for phase in PHASES), (last, now)
            assert sum(now.values()) <= clock.now - origin + 1e-9
            last = now
        phases.finish()
        assert abs(sum(phases.read().values()) - (clock.now - origin)) < 1e-9


def test_a_compilation_dynamo_brackets_is_served_while_it_runs():
    """A first compile can take half an hour (neuronx-cc): it must show as it goes, not all at once at its end."""
    phases, clock = ledger(started_ago=1.0)
    phases.compile_started()
    clock.advance(600.0)
    assert phases.read() == {**dict.fromkeys(PHASES, 0.0), STARTUP: 1.0, COMPILE: 600.0}
    clock.advance(600.0)
    assert phases.read()[COMPILE] == 1200.0
    clock.advance(1.0)
    phases.compile_ended()
    clock.advance(2.0)
    phases.optimizer_created()
    phases.optimizer_stepped()
    assert phases.read() == {**dict.fromkeys(PHASES, 0.0), STARTUP: 3.0, COMPILE: 1201.0}
    # Inside an open phase too, the phase keeps only what the compilation left of it.
    assert phases.enter(DATA)
    clock.advance(1.0)
    phases.compile_started()
    clock.advance(5.0)
    assert phases.read()[COMPILE] == 1206.0
    clock.advance(1.0)
    phases.compile_ended()
    phases.leave()
    phases.optimizer_stepped()
    assert phases.read() == {**dict.fromkeys(PHASES, 0.0), STARTUP: 3.0, COMPILE: 1207.0, DATA: 1.0}


def test_a_device_compilation_seen_running_is_served_at_once_and_its_end_counts_only_the_rest():
    phases, clock = ledger(started_ago=0.0)
    phases.optimizer_created()
    me = threading.get_ident()
    call = clock.now  # a step marker begins and compiles
    clock.advance(2.0)
    phases.device_compiling(me, call, call + 1.0, clock.now)  # a read saw it compiling for the last second
    assert phases.read()[COMPILE] == 1.0
    clock.advance(3.0)
    phases.device_compiling(me, call, call + 2.0, clock.now)
    assert phases.read()[COMPILE] == 4.0
    phases.compiled(4.5, call)  # its CompileTime, told at its end: only the rest is counted
    assert phases.read()[COMPILE] == 4.5
    phases.device_compiling(me, call, call + 5.0, clock.now)  # a read that saw the call just before it ended
    phases.device_compiling(me + 1, clock.now, clock.now - 1.0, clock.now)  # another thread's call
    phases.optimizer_stepped()
    assert phases.read() == {**dict.fromkeys(PHASES, 0.0), COMPILE: 4.5, STEP: 0.5}
    # Seen for longer than it turns out to have compiled: what was served stays, nothing more is counted.
    call = clock.now
    clock.advance(2.0)
    phases.device_compiling(me, call, call, clock.now)
    phases.compiled(1.5, call)
    phases.optimizer_stepped()
    assert phases.read() == {**dict.fromkeys(PHASES, 0.0), COMPILE: 6.5, STEP: 0.5}
