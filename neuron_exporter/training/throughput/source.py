"""The throughput source: counts the samples and tokens of the batches the input pipelines hand the training thread,
reads once what the rank trains in, and serves them with the peak of its devices.

A batch is counted where an input pipeline returns it (``input_pipelines``: a DataLoader iterator's ``next()``,
torch_xla's per-device loader), once:
- on the training thread (``TimePhases.training_thread``): torch_xla's ``MpDeviceLoader`` iterates its DataLoader on
  a thread of its own, whose batches reach the training thread through its per-device loader, counted there;
- at the outermost entry point: a loader that draws from another on the same thread (accelerate's
  ``DataLoaderShard``, a DataLoader iterator calling another's) hands over one batch, not two;
- with gradients on: a batch taken under ``torch.no_grad()`` or ``inference_mode`` (an evaluation loop) is not
  training.
The cost on the training thread: a few attribute reads per batch (``batch_counts``), and one look at the optimizer's
parameters at its first step.

FLOPs (``training_flops_total``) come from the graphs ``torch.compile`` compiles (``graph_flops``: counted once
each, when dynamo hands them to its backend, and then at each call), else from the batches' work on an eager device
(``sampled_flops``: the first batch of each shape sampled, on torch_xla too).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from typing import NamedTuple

import torch
from prometheus_client.core import Metric

from ...catalogue import TRAINING_FLOPS, TRAINING_PEAK_FLOPS, TRAINING_SAMPLES, TRAINING_TOKENS
from ...metric_family import single_series
from ..import_watch import after_import, forget
from ..input_pipelines import BATCH, NO_BATCH, PIPELINES
from ..patching import Patch
from ..self_metrics import SelfStats
from ..source import Source, Sources
from .batches import batch_counts
from .graph_flops import GraphFlops
from .peaks import neuroncore_version, table_peak
from .sampled_flops import SampledFlops

MAX_PARAMETERS = 64  # looked at for the first floating-point one
MAX_LOOKS = 8  # optimizer steps that look for it
UNREAD = object()


class TrainedIn(NamedTuple):
    dtype: str  # torch's name: torch.bfloat16
    device: str  # the device's type: xla, neuron, cpu
    functional: bool  # the parameters are functionalized (torch_xla's, unless XLA_DISABLE_FUNCTIONALIZATION)


class ThroughputSource(Source):
    def __init__(self, sources: Sources):
        self._sources = sources
        self.stats = sources.stats
        self._peak_option = sources.options.peak_flops
        self._version: object = UNREAD  # the NeuronCores' version, read once when the table is asked
        self._compiler_patch: Patch | None = None
        self._start()

    def _start(self) -> None:
        self.samples = 0
        self.tokens = 0
        self.graph_flops = GraphFlops(self.step_error)
        self.sampled_flops = SampledFlops(self.step_error, eager=self._eager, functional=self._functional)
        self._inside = False  # the training thread is in an entry point whose batch it counts
        self.trained_in: TrainedIn | None = None
        self._looks = 0

    def install(self) -> bool:
        PIPELINES.add(self, (BATCH,), self.step_error)
        after_import("torch._dynamo.output_graph", self._count_compiled_graphs)
        return True

    def uninstall(self) -> None:
        PIPELINES.remove(self)
        forget(self._count_compiled_graphs)
        if self._compiler_patch is not None:
            self._compiler_patch.undo()

    def _count_compiled_graphs(self) -> None:
        from torch._dynamo.output_graph import OutputGraph

        if self._compiler_patch is None:
            wrap = self._wrap_compiler  # the graphs' counts of this source as it is now (a forked child has new ones)
            self._compiler_patch = Patch(OutputGraph, "call_user_compiler", wrap, self.step_error)
        self._compiler_patch.install()

    def _wrap_compiler(self, original):
        counts = self

        def call_user_compiler(output_graph, gm, example_inputs, *args, **kwargs):
            return counts.graph_flops.wrap(original)(output_graph, gm, example_inputs, *args, **kwargs)

        return call_user_compiler

    def _eager(self) -> bool:
        """The training steps run op by op (eagerly, or traced lazily by torch_xla): no graph compiled by
        torch.compile, and what the optimizer steps is known. torch_xla without functionalization
        (XLA_DISABLE_FUNCTIONALIZATION) traces other graphs under a dispatch mode (views fold differently): not
        sampled."""
        trained = self.trained_in
        return (
            self.graph_flops.compiled == 0 and trained is not None and (trained.device != "xla" or trained.functional)
        )

    def _functional(self) -> str | None:
        trained = self.trained_in
        return trained.device if trained is not None and trained.functional else None

    def after_fork(self, stats: SelfStats) -> None:
        super().after_fork(stats)
        self._start()

    def parts(self) -> dict:
        return {"throughput": self.families}

    def diagnosis(self, rank: dict) -> None:
        work = {
            "samples": self.samples,
            "tokens": self.tokens,
            "flops": self.sampled_flops.total + self.graph_flops.total(),
            "seconds": sum(self._sources.phases.read().values()),  # this process's life: its counts' too
        }
        peak = self.peak()
        rank["throughput"] = work if peak is None else {**work, "peak_flops": peak}

    # -- the input pipelines' entry points (``input_pipelines.Listener``) -------------------------------------------
    def entered(self) -> bool:
        if self._inside or threading.get_ident() != self._sources.phases.thread or not torch.is_grad_enabled():
            return False
        self._inside = True
        self.sampled_flops.fetching()  # the last batch's work is done
        return True

    def left(self, counting: bool, batch: object) -> None:
        if not counting:
            return
        self._inside = False
        if batch is NO_BATCH:
            return
        try:
            samples, tokens = batch_counts(batch)
        except Exception as error:  # noqa: BLE001 (a batch of an unusual shape: never into the loop)
            self.step_error(error)
            return
        self.samples += samples
        self.tokens += tokens
        try:
            self.sampled_flops.fetched(batch)
        except Exception as error:  # noqa: BLE001
            self.step_error(error)

    # -- optimizer steps (``SeesOptimizerSteps``) ---------------------------------------------------------------------
    def on_optimizer_step(self, optimizer) -> None:
        if threading.get_ident() == self._sources.phases.thread:
            self.sampled_flops.optimizer_stepped()
        if self.trained_in is not None or self._looks >= MAX_LOOKS:
            return
        self._looks += 1
        try:
            self.trained_in = _trained_in(optimizer)
        except Exception as error:  # noqa: BLE001 (an optimizer of an unusual shape)
            self.step_error(error)

    # -- reading ------------------------------------------------------------------------------------------------------
    def families(self, labels: dict[str, str]) -> Iterator[Metric]:
        yield single_series(TRAINING_SAMPLES, labels, self.samples)
        yield single_series(TRAINING_TOKENS, labels, self.tokens)
        yield single_series(TRAINING_FLOPS, labels, self.sampled_flops.total + self.graph_flops.total())
        peak = self.peak()
        if peak is not None:
            yield single_series(TRAINING_PEAK_FLOPS, labels, peak)

    def peak(self) -> float | None:
        """The rank's peak FLOP/s: the ``peak_flops`` option, else the table's for what it trains in; None if
        unknown (not on a NeuronCore, not trained yet, a data type the tables lack)."""
        if self._peak_option > 0:
            return self._peak_option
        trained = self.trained_in
        if trained is None:
            return None
        if self._version is UNREAD:
            self._version = neuroncore_version()  # a few small sysfs reads, once, off the training thread
        version = self._version if isinstance(self._version, int) else None
        return table_peak(version, trained.dtype, trained.device, os.environ)


def _trained_in(optimizer) -> TrainedIn | None:
    """The dtype and device type of the first floating-point parameter ``optimizer`` steps; None if none of the
    first ``MAX_PARAMETERS`` is one."""
    looked = 0
    for group in optimizer.param_groups:
        for parameter in group["params"]:
            if parameter.is_floating_point():
                functional = torch._C._dispatch_keys(parameter).has(torch._C.DispatchKey.Functionalize)
                return TrainedIn(str(parameter.dtype), parameter.device.type, functional)
            looked += 1
            if looked >= MAX_PARAMETERS:
                return None
    return None
