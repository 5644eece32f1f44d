"""Training steps for every backend: ``training_steps_total`` and ``training_step_duration_seconds``.

A *training step* is one round of optimizer steps: each ``torch.optim`` optimizer steps at most once in it (a GAN's
two optimizers make one step; gradient accumulation makes one step per optimizer step). It starts where the step
before it ended (the first one where its optimizer was made, or at ``attach()`` if it was made before).

Where it ends depends on what the optimizer updates:
- tensors on an XLA device: the optimizer step only records work, which runs at the next step marker; the step ends
  at the first step marker that runs a graph after it (torch_xla's ``StepTracker``). ``training_steps_total`` is then
  ``xla_steps_total`` itself, counted once, in one place: the two cannot drift apart.
- anything else (eager, inductor, CUDA, CPU): the step ends at its optimizer step (the first of its round, when
  several optimizers step in turn), when its work has been issued. Counted here, from the optimizer-step hook: an
  optimizer that steps again begins the next round.
Which of the two is decided at the first optimizer step, by the device of that optimizer's first parameter.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

from prometheus_client.core import Metric

from ... import catalogue
from ...metric_family import histogram_family, single_series
from ..histogram import STEP_DURATION_BUCKETS, Histogram
from ..self_metrics import SelfStats
from ..source import Source, StepCounts


class TrainingSteps(Source):
    def __init__(self, lazy_steps: Callable[[], StepCounts | None], clock: Callable[[], float] = time.perf_counter):
        """``lazy_steps()``: the steps another source counts where they end on an XLA device (None without one)."""
        self._lazy_steps = lazy_steps
        self._clock = clock
        self._start()

    def _start(self) -> None:
        self._lock = threading.Lock()
        self.on_xla: bool | None = None  # decided at the first optimizer step
        self.steps = 0
        self.duration = Histogram(STEP_DURATION_BUCKETS)
        self._round: set[int] = set()  # the optimizers that stepped in the current step
        self._step_end = self._clock()  # where the next step starts
        self.last_step_end: float | None = None

    def after_fork(self, stats: SelfStats) -> None:
        self._start()

    def parts(self) -> dict:
        return {"training_steps": self.families}

    def diagnosis(self, rank: dict) -> None:
        if not self.on_xla:  # on an XLA device, the XLA source's steps
            rank["steps"] = self.steps

    @property
    def last_active(self) -> float | None:
        return self.last_step_end

    # -- the training thread ------------------------------------------------------------------------------
    def on_optimizer_created(self) -> None:
        if not self.steps:
            self._step_end = self._clock()

    def on_optimizer_step(self, optimizer) -> None:
        """After an optimizer's ``step()``, on the thread that stepped it."""
        if self.on_xla is None:
            self.on_xla = _updates_xla_tensors(optimizer)
        if self.on_xla:
            return
        key = id(optimizer)
        with self._lock:
            if self._round and key not in self._round:
                self._round.add(key)  # another optimizer of the same step
                return
            now = self._clock()
            self._round = {key}
            self.steps += 1
            self.duration.observe(now - self._step_end)
            self._step_end = self.last_step_end = now

    # -- reading ------------------------------------------------------------------------------------------
    def families(self, labels: dict[str, str]) -> Iterator[Metric]:
        steps, duration = self._state()
        yield single_series(catalogue.TRAINING_STEPS, labels, steps)
        yield histogram_family(catalogue.TRAINING_STEP_DURATION, labels, duration)

    def _state(self) -> tuple[int, Histogram]:
        if self.on_xla:
            lazy = self._lazy_steps()
            if lazy is not None and lazy.optimizer_steps:
                return lazy.steps, lazy.step_duration
            return 0, Histogram(STEP_DURATION_BUCKETS)
        with self._lock:
            return self.steps, self.duration.copy()


def _updates_xla_tensors(optimizer) -> bool:
    try:
        for group in optimizer.param_groups:
            for parameter in group["params"]:
                return parameter.device.type == "xla"
    except Exception:  # noqa: BLE001 (an optimizer of an unusual shape is taken for one that runs eagerly)
        pass
    return False
