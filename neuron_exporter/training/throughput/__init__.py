"""The work the training steps do, on every backend: the samples and tokens of the batches the input pipelines hand
the training thread (``training_samples_total``, ``training_tokens_total``: ``batches``, counted at the entry points
the time phases time, ``input_pipelines``), the FLOPs of its steps (``training_flops_total``: ``graph_flops`` for
what torch.compile compiled, ``sampled_flops`` for eager work and torch_xla's), and the peak of the rank's devices
(``training_peak_flops``: ``peaks``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..source import SourceKind

if TYPE_CHECKING:
    from ..source import Source, Sources


def _start(sources: Sources) -> Source:
    from .source import ThroughputSource

    return ThroughputSource(sources)


SOURCE = SourceKind("throughput", "torch", _start)
