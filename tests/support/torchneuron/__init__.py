"""An emulated TorchNeuron for the tests: ``torch_neuronx`` (this directory's package) on a ``neuron`` device that
runs on the CPU. It needs a torch with PyTorch's Python backend registration (``torch._C._acc``: torch 2.14 here,
the torch TorchNeuron 2.14 is built for); ``STANDIN`` is the directory to put on ``sys.path`` or ``PYTHONPATH``."""

from __future__ import annotations

from pathlib import Path

STANDIN = Path(__file__).resolve().parent


def emulation_problem() -> str | None:
    """Why the ``neuron`` device cannot be emulated with the torch installed here, None if it can."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not hasattr(torch._C, "_acc") or not hasattr(torch._C._acc, "create_empty_tensor"):
        return f"torch {torch.__version__} has no Python backend registration (torch._C._acc); TorchNeuron needs 2.13+"
    return None
