"""neuron-exporter: Prometheus metrics for PyTorch/XLA training.

``neuron_exporter.attach()`` hooks every step of a training loop and serves ``/metrics``.
The package imports without torch_xla; only ``attach()`` needs it.
"""

__version__ = "0.1.0"

from .training.attach import ExporterHandle, attach, detach  # noqa: E402

__all__ = ["ExporterHandle", "attach", "detach", "__version__"]
