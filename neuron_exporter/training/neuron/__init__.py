"""The TorchNeuron source (torch-neuronx 2.13 / 2.14, the native ``neuron`` device of PyTorch), started once
``torch_neuronx`` is imported: CPU fallbacks (``fallbacks``), compilations and the compile cache (``compiles``), host
reads of ``neuron`` tensors, device memory; every name of TorchNeuron it reads, with where it is documented, in
``names``; the families in ``families``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..source import SourceKind
from .names import LIBRARY

if TYPE_CHECKING:
    from ..source import Source, Sources


def _start(sources: Sources) -> Source:
    from .source import NeuronSource

    return NeuronSource(sources.options, sources.stats, lambda: sources.phases)


SOURCE = SourceKind("neuron", LIBRARY, _start)
