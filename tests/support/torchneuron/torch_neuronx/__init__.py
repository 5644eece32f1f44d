"""A stand-in for TorchNeuron (``torch-neuronx`` 2.14, the native backend) for tests without Trainium: the ``neuron``
device emulated on the CPU (``device``), the functions of ``torch_neuronx`` the exporter may read, with the shapes
AWS documents, and the ``neuron`` backend of ``torch.compile`` (``neuron_dynamo_backend``).

Put its directory (tests/support/torchneuron) on ``sys.path`` and ``import torch_neuronx``. Every
``synchronize()`` of the device is counted in ``_C.syncs``; ``get_dynamo_metrics()`` synchronizes, as the real one
does.
"""

from __future__ import annotations

from . import _C, device

__version__ = "2.14.3.0+standin"

device.register()

from . import neuron_dynamo_backend  # noqa: E402  (registers the "neuron" backend once the device exists)
from .neuron_dynamo_backend.metrics import get_dynamo_metrics, reset_dynamo_metrics  # noqa: E402


def synchronize(device=None) -> None:
    _C._synchronize()


def get_fallback_ops() -> list[str]:
    return _C._get_fallback_ops()


def get_executed_ops() -> list[str]:
    return _C._get_executed_ops()


def clear_op_tracking() -> None:
    _C._clear_op_tracking()


__all__ = [
    "clear_op_tracking",
    "get_dynamo_metrics",
    "get_executed_ops",
    "get_fallback_ops",
    "neuron_dynamo_backend",
    "reset_dynamo_metrics",
    "synchronize",
]
