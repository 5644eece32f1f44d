"""Training steps counted from ``torch.optim`` optimizers, whatever runs the model (``training_steps``), and the hook
that sees every optimizer made and stepped (``optimizer_hook``, installed by the handle for every source)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..source import SourceKind

if TYPE_CHECKING:
    from ..source import Source, Sources


def _start(sources: Sources) -> Source:
    from .training_steps import TrainingSteps

    return TrainingSteps(sources.step_counts)


SOURCE = SourceKind("training_steps", "torch", _start)
