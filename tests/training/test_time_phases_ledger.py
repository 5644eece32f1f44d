"""The time-phases ledger on a clock the test moves: the phases partition the training thread's time, nested phases
count once (compile wherever it happens, else the outermost), and what is served never goes backwards."""

from __future__ import annotations

import random
import threading

import pytest

from neuron_exporter.training.time_phases import (
    CHECKPOINT,
    COMPILE,
    DATA,
    HOST_SYNC,
    OTHER,
    PHASES,
    RECOVERY,
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
    with phases.phase(phase):
        clock.advance(seconds)


def device(phases: TimePhases, clock: Clock, took: float, compiled: float) -> None:
    """A call into a device (a step marker) that took ``took`` seconds, of which it compiled ``compiled``."""
    call = phases.device_call()
    clock.advance(took)
    phases.device_call_ended(call, compiled)


class Probe:
    """What a device source answers a read that asks whether its call compiles now."""

    def __init__(self) -> None:
        self.compiling = False

    def __call__(self, call) -> bool:
        return self.compiling


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
        STARTUP: 3.5,  # to the first optimizer step
        CHECKPOINT: 3.0,
        DATA: 0.75,
        HOST_SYNC: 0.375,
        STEP: 2.0,
        COMPILE: 0.0,
        OTHER: 0.5,
        RECOVERY: 0.0,  # the run's, between processes: never a process's own
    }


def test_compiling_is_compile_wherever_it_happens_and_counts_once():
    phases, clock = ledger(started_ago=0.0)
    phases.optimizer_stepped()  # a first step: what follows is training
    # A host read whose graph compiled for 3 of its 4 seconds (told afterwards, as torch_xla's compilations are).
    with phases.phase(HOST_SYNC):
        device(phases, clock, took=4.0, compiled=3.0)
    # dynamo compiling for 2 seconds, in which a device compiled too (counted once), then a step marker that
    # compiled 0.5 s in the step itself.
    phases.compile_started()
    device(phases, clock, took=2.0, compiled=1.5)
    phases.compile_ended()
    device(phases, clock, took=1.0, compiled=0.5)
    phases.optimizer_stepped()
    assert phases.read() == {**dict.fromkeys(PHASES, 0.0), HOST_SYNC: 1.0, COMPILE: 5.5, STEP: 0.5}


def test_a_compilation_told_for_longer_than_its_call_took_counts_the_call_only():
    phases, clock = ledger(started_ago=0.0)
    phases.optimizer_stepped()  # a first step: what follows is training
    device(phases, clock, took=1.0, compiled=5.0)  # more than the call took: a clock of another kind
    phases.optimizer_stepped()
    assert phases.read()[COMPILE] == 1.0 and phases.read()[STEP] == 0.0


def test_nested_phases_count_in_the_outermost():
    phases, clock = ledger(started_ago=0.0)
    with phases.phase(CHECKPOINT):  # torch.save of device tensors reads them to the host
        within(HOST_SYNC, 1.0, phases, clock)
        clock.advance(1.0)
    phases.optimizer_stepped()
    assert phases.read()[CHECKPOINT] == 2.0 and phases.read()[HOST_SYNC] == 0.0


def test_other_threads_count_nothing_until_one_steps_first():
    phases, clock = ledger(started_ago=0.0)
    worker = threading.Thread(target=lambda: within(DATA, 1.0, phases, clock))
    worker.start()
    worker.join()
    assert phases.read()[DATA] == 0.0
    # An optimizer that steps first on another thread makes that thread the training thread.
    stepper = threading.Thread(target=lambda: (phases.optimizer_stepped(), within(DATA, 1.0, phases, clock)))
    stepper.start()
    stepper.join()
    assert phases.training_thread is stepper and phases.read()[DATA] == 1.0
    within(DATA, 1.0, phases, clock)  # the main thread's, now not the training thread's
    assert phases.read()[DATA] == 1.0


def test_before_any_optimizer_the_time_so_far_is_startup_and_a_process_that_never_trains_ends_in_it():
    phases, clock = ledger(started_ago=1.0)
    clock.advance(1.0)
    assert phases.read()[STARTUP] == 2.0
    clock.advance(1.0)
    phases.finish()
    clock.advance(5.0)
    assert phases.read() == {**dict.fromkeys(PHASES, 0.0), STARTUP: 3.0}
    assert phases.open(DATA) is None  # nothing is counted after the end


def test_served_totals_never_go_backwards_and_sum_to_the_wall_time_at_each_step():
    rng = random.Random(7)
    for _ in range(200):
        phases, clock = ledger(started_ago=rng.random())
        origin = clock.now - (phases.read()[STARTUP])
        last = phases.read()
        lanes = []
        compiling = 0
        for _ in range(60):
            event = rng.choice(
                ("enter", "leave", "compile_start", "compile_end", "compiled", "device_call", "created", "step")
            )
            clock.advance(rng.random())
            if event == "enter" and len(lanes) < 3:
                lanes.append(phases.open(rng.choice((DATA, HOST_SYNC, CHECKPOINT))))
            elif event == "leave" and lanes:
                phases.close(lanes.pop())
            elif event == "compile_start" and compiling < 2:
                phases.compile_started()
                compiling += 1
            elif event == "compile_end" and compiling:
                phases.compile_ended()
                compiling -= 1
            elif event == "compiled":
                device(phases, clock, took=rng.random(), compiled=rng.random() * 2)
            elif event == "device_call":  # a step marker that compiles, seen by reads while it runs
                probe = Probe()
                call = phases.device_call(probe)
                began = clock.now
                for _ in range(rng.randrange(5)):
                    clock.advance(rng.random())
                    probe.compiling = rng.random() < 0.8
                    now = phases.read()
                    assert all(now[phase] >= last[phase] - 1e-12 for phase in PHASES), (last, now)
                    last = now
                clock.advance(rng.random())
                phases.device_call_ended(call, rng.random() * (clock.now - began) * 1.2)
                phases.read()  # a read that raced the end: the call is gone
            elif event == "created":
                phases.optimizer_created()
            elif event == "step" and not lanes and not compiling:
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
    lane = phases.open(DATA)
    clock.advance(1.0)
    phases.compile_started()
    clock.advance(5.0)
    assert phases.read()[COMPILE] == 1206.0
    clock.advance(1.0)
    phases.compile_ended()
    phases.close(lane)
    phases.optimizer_stepped()
    assert phases.read() == {**dict.fromkeys(PHASES, 0.0), STARTUP: 3.0, COMPILE: 1207.0, DATA: 1.0}


def test_a_device_compilation_seen_running_is_served_at_once_and_its_end_counts_only_the_rest():
    phases, clock = ledger(started_ago=0.0)
    phases.optimizer_stepped()  # a first step: what follows is training
    probe = Probe()
    call = phases.device_call(probe)  # a step marker begins and compiles
    clock.advance(1.0)
    probe.compiling = True
    assert phases.read()[COMPILE] == 0.0  # counted from the first read that sees it compiling
    clock.advance(1.0)
    assert phases.read()[COMPILE] == 1.0
    clock.advance(3.0)
    assert phases.read()[COMPILE] == 4.0
    phases.device_call_ended(call, 4.5)  # its CompileTime, told at its end: only the rest is counted
    assert phases.read()[COMPILE] == 4.5
    phases.optimizer_stepped()
    assert phases.read() == {**dict.fromkeys(PHASES, 0.0), COMPILE: 4.5, STEP: 0.5}
    # Seen for longer than it turns out to have compiled: what was served stays, nothing more is counted.
    call = phases.device_call(probe)
    phases.read()
    clock.advance(2.0)
    phases.read()
    phases.device_call_ended(call, 1.5)
    phases.optimizer_stepped()
    assert phases.read() == {**dict.fromkeys(PHASES, 0.0), COMPILE: 6.5, STEP: 0.5}
    # Another thread's call is not asked about, and counts nothing.
    other = threading.Thread(target=lambda: phases.device_call(probe))
    other.start()
    other.join()
    clock.advance(1.0)
    phases.read()
    clock.advance(1.0)
    assert phases.read()[COMPILE] == 6.5


def on_thread(action) -> threading.Thread:
    thread = threading.Thread(target=action)
    thread.start()
    thread.join()
    return thread


def test_a_compilation_closes_on_the_thread_that_opened_it_whatever_steps_elsewhere():
    """Two threads each train a compiled model: nothing is left open, and nothing grows by itself once idle."""
    phases, clock = ledger(started_ago=0.0)
    phases.optimizer_created()
    phases.optimizer_stepped()  # the main thread trains
    other_started = threading.Event()
    other_may_end = threading.Event()

    def other_trainer() -> None:
        phases.compile_started()  # its own model compiles while the main thread goes on
        other_started.set()
        other_may_end.wait()
        phases.optimizer_stepped()  # another training thread: the main thread's time is still the one served
        phases.compile_ended()

    other = threading.Thread(target=other_trainer)
    other.start()
    other_started.wait()
    phases.compile_started()
    clock.advance(2.0)
    other_may_end.set()
    other.join()
    phases.compile_ended()
    within(DATA, 1.0, phases, clock)
    within(CHECKPOINT, 0.5, phases, clock)
    phases.optimizer_stepped()
    served = phases.read()
    assert served == {**dict.fromkeys(PHASES, 0.0), COMPILE: 2.0, DATA: 1.0, CHECKPOINT: 0.5}
    clock.advance(2.0)
    assert phases.read() == served  # idle: no phase open anywhere, nothing grows


def test_another_threads_compilation_neither_hides_nor_counts_as_the_training_threads():
    phases, clock = ledger(started_ago=0.0)
    phases.optimizer_stepped()
    evaluating = threading.Event()
    done = threading.Event()

    def evaluator() -> None:
        phases.compile_started()
        evaluating.set()
        done.wait()
        phases.compile_ended()

    other = threading.Thread(target=evaluator)
    other.start()
    evaluating.wait()
    clock.advance(1.0)  # the training thread steps while the evaluator compiles: not compile
    phases.compile_started()  # then compiles itself, inside the evaluator's compilation
    clock.advance(3.0)
    phases.compile_ended()
    done.set()
    other.join()
    phases.optimizer_stepped()
    assert phases.read() == {**dict.fromkeys(PHASES, 0.0), COMPILE: 3.0, STEP: 1.0}


def test_a_compilation_on_a_thread_python_did_not_start_is_the_training_threads():
    """autograd's device thread compiles a backward graph lazily while the training thread waits in backward()."""
    import _thread

    phases, clock = ledger(started_ago=0.0)
    phases.optimizer_stepped()
    finished = threading.Event()

    def autograd_thread() -> None:
        phases.compile_started()
        clock.advance(2.0)
        phases.compile_ended()
        finished.set()

    _thread.start_new_thread(autograd_thread, ())
    finished.wait()
    clock.advance(1.0)
    phases.optimizer_stepped()
    assert phases.read() == {**dict.fromkeys(PHASES, 0.0), COMPILE: 2.0, STEP: 1.0}
    # A Python thread's own compilation is not the training thread's.
    on_thread(lambda: (phases.compile_started(), clock.advance(2.0), phases.compile_ended()))
    phases.optimizer_stepped()
    assert phases.read() == {**dict.fromkeys(PHASES, 0.0), COMPILE: 2.0, STEP: 3.0}


@pytest.mark.parametrize("read_before_step", [False, True])
def test_the_thread_that_makes_the_optimizer_trains_and_its_checkpoint_load_counts_whether_or_not_a_read_came(
    read_before_step,
):
    phases, clock = ledger(started_ago=1.0)

    def worker() -> None:
        phases.optimizer_created()
        within(CHECKPOINT, 2.0, phases, clock)  # resumes from a checkpoint before its first step
        if read_before_step:
            phases.read()
        clock.advance(1.0)
        phases.optimizer_stepped()
        clock.advance(1.0)
        phases.optimizer_stepped()

    trainer = on_thread(worker)
    assert phases.training_thread is trainer
    assert phases.read() == {**dict.fromkeys(PHASES, 0.0), STARTUP: 2.0, CHECKPOINT: 2.0, STEP: 1.0}


def test_a_thread_that_steps_after_the_training_thread_ended_takes_over():
    phases, clock = ledger(started_ago=0.0)
    first = on_thread(lambda: (clock.advance(1.0), phases.optimizer_stepped()))
    assert phases.training_thread is first
    second = on_thread(lambda: (within(DATA, 1.0, phases, clock), phases.optimizer_stepped()))
    assert phases.training_thread is second  # the first had ended: the second's steps count from its first
    third = on_thread(lambda: (within(DATA, 1.0, phases, clock), phases.optimizer_stepped()))
    assert phases.training_thread is third
    assert sum(phases.read().values()) == clock.now - 100.0


def test_a_detach_and_attach_again_go_on_from_the_same_totals():
    phases, clock = ledger(started_ago=1.0)
    phases.optimizer_stepped()  # a first step: what follows is training
    within(DATA, 1.0, phases, clock)
    clock.advance(1.0)
    phases.optimizer_stepped()
    phases.finish()
    clock.advance(5.0)  # detached: an evaluation, whatever; the base's, after a step ``other``
    before = phases.read()
    assert before == {**dict.fromkeys(PHASES, 0.0), STARTUP: 1.0, DATA: 1.0, STEP: 1.0}
    phases.resume()
    within(CHECKPOINT, 1.0, phases, clock)
    clock.advance(1.0)
    phases.optimizer_stepped()
    assert phases.read() == {**before, OTHER: 5.0, CHECKPOINT: 1.0, STEP: 2.0}
    assert sum(phases.read().values()) == clock.now - 99.0


def test_an_optimizer_made_and_never_stepped_leaves_nothing_behind_the_wall_time():
    """Until the first optimizer step every read serves the start-up so far, optimizer made or not."""
    phases, clock = ledger(started_ago=1.0)
    phases.optimizer_created()
    clock.advance(3.0)
    assert phases.read() == {**dict.fromkeys(PHASES, 0.0), STARTUP: 4.0}
    within(CHECKPOINT, 1.0, phases, clock)
    clock.advance(1.0)
    assert phases.read() == {**dict.fromkeys(PHASES, 0.0), STARTUP: 5.0, CHECKPOINT: 1.0}
