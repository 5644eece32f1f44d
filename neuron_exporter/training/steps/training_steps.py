"""Training steps for every backend: ``training_steps_total`` and ``training_step_duration_seconds``.

A *training step* is one round of optimizer steps: each ``torch.optim`` optimizer steps at most once in it (a GAN's
two optimizers make one step; gradient accumulation makes one step per optimizer step). It starts where the step
before it ended (the first one where its optimizer was made, or at ``attach()`` if it was made before).

Where it ends depends on what the optimizer updates:
- tensors on a lazy device, one whose source ends the steps of its optimizers itself (``Source.device``; torch_xla's
  ``xla``): the optimizer step only records work, which runs at the device's next step; the step ends there, and
  that source counts it. ``training_steps_total`` adds its count, counted once, in one place: the two cannot drift
  apart.
- anything else (eager, inductor, CUDA, CPU): the step ends at its optimizer step (the first of its round, when
  several optimizers step in turn), when its work has been issued. Counted here, from the optimizer-step hook: an
  optimizer that steps again begins the next round, and so does the first step of an optimizer made since the round
  began (a new optimizer that takes over from the last: the optimizers of one round are made before it).
Which of the two is decided for each optimizer at its first step, by the device of its first parameter.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Iterator

from prometheus_client.core import Metric

from ... import catalogue, fork_safe
from ...metric_family import histogram_family, single_series
from ..histogram import STEP_DURATION_BUCKETS, Histogram
from ..self_metrics import SelfStats
from ..source import Source, StepCounts

UNKNOWN = object()


class TrainingSteps(Source):
    def __init__(self, lazy_steps: Callable[[str], StepCounts | None], clock: Callable[[], float] = time.perf_counter):
        """``lazy_steps(device type)``: the steps the source of that lazy device counts, None if there is none."""
        self._lazy_steps = lazy_steps
        self._clock = clock
        self._start()

    def _start(self) -> None:
        self._lock = fork_safe.Lock()
        self.lazy_devices: set[str] = set()  # lazy devices whose optimizers stepped: their sources count the steps
        self._devices: dict[int, str | None] = {}  # optimizer -> its lazy device, None if it steps eagerly
        self.steps = 0
        self.duration = Histogram(STEP_DURATION_BUCKETS)
        self._round: set[int] = set()  # the optimizers that stepped in the current step
        self._stepped: weakref.WeakSet = weakref.WeakSet()  # the optimizers that ever stepped eagerly
        self._created = 0  # optimizers made
        self._created_before_round = 0  # of them, those made before the current step began
        self._step_end = self._clock()  # where the next step starts
        self.last_step_end: float | None = None

    def install(self) -> bool:
        return True  # the handle's optimizer hook calls it

    def uninstall(self) -> None:
        pass

    def after_fork(self, stats: SelfStats) -> None:
        self._start()

    def parts(self) -> dict:
        return {"training_steps": self.families}

    def diagnosis(self, rank: dict) -> None:
        if not self.lazy_devices:  # on a lazy device, its source's steps
            rank["steps"] = self.steps

    @property
    def last_active(self) -> float | None:
        return self.last_step_end

    # -- the training thread ------------------------------------------------------------------------------
    def on_optimizer_created(self) -> None:
        self._created += 1
        self._devices = {}  # an id may be reused by the new optimizer
        if not self.steps:
            self._step_end = self._clock()

    def on_optimizer_step(self, optimizer) -> None:
        """After an optimizer's ``step()``, on the thread that stepped it."""
        key = id(optimizer)
        device = self._devices.get(key, UNKNOWN)
        if device is UNKNOWN:
            device = self._devices[key] = self._lazy_device(optimizer)
        if device is not None:
            return
        with self._lock:
            if key not in self._round:
                first = self._first_step(optimizer)
                if self._round and not (first and self._created > self._created_before_round):
                    self._round.add(key)  # another optimizer of the same step
                    return
            now = self._clock()
            self._round = {key}
            self._created_before_round = self._created
            self.steps += 1
            self.duration.observe(now - self._step_end)
            self._step_end = self.last_step_end = now

    def _first_step(self, optimizer) -> bool:
        try:
            first = optimizer not in self._stepped
            self._stepped.add(optimizer)
            return first
        except TypeError:  # an optimizer of an unusual shape, without weak references: taken for one seen before
            return False

    def _lazy_device(self, optimizer) -> str | None:
        device = _device_type(optimizer)
        if device is not None and self._lazy_steps(device) is not None:
            self.lazy_devices.add(device)
            return device
        return None

    # -- reading ------------------------------------------------------------------------------------------
    def families(self, labels: dict[str, str]) -> Iterator[Metric]:
        steps, duration = self._state()
        yield single_series(catalogue.TRAINING_STEPS, labels, steps)
        yield histogram_family(catalogue.TRAINING_STEP_DURATION, labels, duration)

    def _state(self) -> tuple[int, Histogram]:
        with self._lock:
            steps, duration = self.steps, self.duration.copy()
        for device in list(self.lazy_devices):
            lazy = self._lazy_steps(device)
            if lazy is not None and lazy.optimizer_steps:
                steps += lazy.steps
                duration.add(lazy.step_duration)
        return steps, duration


def _device_type(optimizer) -> str | None:
    try:
        for group in optimizer.param_groups:
            for parameter in group["params"]:
                return parameter.device.type
    except Exception:  # noqa: BLE001 (an optimizer of an unusual shape is taken for one that runs eagerly)
        pass
    return None
