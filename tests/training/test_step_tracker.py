"""Which step markers are steps, before it is known whether the process trains with an optimizer: pure logic, fed
the events the step hook records (compile counters around each marker, optimizer events)."""

from __future__ import annotations

from neuron_exporter.training.xla.step_tracker import SETUP_MARKERS, SETUP_SECONDS, StepTracker, Sync


class Loop:
    """Step markers that each run one graph, the counters going up as torch_xla's would."""

    def __init__(self):
        self.graphs = 0
        self.now = 1000.0
        self.tracker = StepTracker(warmup_steps=2, graphs_seen=0, compiles_seen=0, clock=lambda: self.now)

    def marker(self, seconds: float = 0.5) -> None:
        self.now += seconds
        before = self.graphs
        self.graphs += 1
        stepped, self.tracker.optimizer_steps = self.tracker.optimizer_steps, 0
        self.tracker.record(Sync(before, 0, self.graphs, 0, self.now, None, stepped))

    def optimizer_step(self) -> None:
        self.tracker.optimizer_steps += 1


def test_markers_before_the_optimizer_exists_are_setup_not_steps():
    loop = Loop()
    loop.marker()  # a broadcast of the initial weights
    loop.marker()  # a checkpoint load
    loop.tracker.on_optimizer_created()
    for _ in range(5):
        loop.optimizer_step()
        loop.marker()
    state = loop.tracker.state()
    assert (state.steps, state.markers, state.graphs_per_step.counts[0]) == (5, 7, 5)
    # the first training step from the optimizer's creation, the others from the step before; never from setup
    assert (sum(state.step_duration.counts), state.step_duration.total) == (5, 5 * 0.5)


def test_an_optimizer_made_before_attach_is_seen_at_its_first_step():
    loop = Loop()
    loop.marker()  # setup
    for _ in range(3):
        loop.optimizer_step()
        loop.marker()
    assert loop.tracker.state().steps == 3


def test_without_an_optimizer_the_held_markers_become_steps_with_their_own_durations():
    loop = Loop()
    seen = []
    for _ in range(SETUP_MARKERS - 1):
        loop.marker()
        seen.append(loop.tracker.state().steps)
    loop.marker()
    state = loop.tracker.state()
    assert seen == [0] * (SETUP_MARKERS - 1) and state.steps == SETUP_MARKERS
    assert (
        sum(state.step_duration.counts) == SETUP_MARKERS - 1 and state.step_duration.total == (SETUP_MARKERS - 1) * 0.5
    )
    loop.marker()
    assert loop.tracker.state().steps == SETUP_MARKERS + 1  # from now on at once


def test_slow_markers_without_an_optimizer_are_steps_after_the_setup_time():
    loop = Loop()
    loop.marker()
    loop.marker(seconds=SETUP_SECONDS)
    assert loop.tracker.state().steps == 2


def test_a_process_that_ends_before_it_is_known_counts_its_markers_as_steps():
    loop = Loop()
    loop.marker()
    loop.marker()
    loop.tracker.end()
    assert loop.tracker.state().steps == 2


def test_an_optimizer_that_turns_up_late_never_takes_steps_back():
    loop = Loop()
    for _ in range(SETUP_MARKERS):
        loop.marker()
    loop.tracker.on_optimizer_created()
    loop.optimizer_step()
    loop.marker()
    assert loop.tracker.state().steps == SETUP_MARKERS + 1
