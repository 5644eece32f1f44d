"""neuron-exporter: Prometheus metrics for PyTorch/XLA training.

``neuron_exporter.attach()`` hooks every step of a training loop and serves ``/metrics``.
The package imports without torch_xla; only ``attach()`` needs it.
"""

__version__ = "0.1.0"

__all__ = ["ExporterHandle", "attach", "detach", "__version__"]


def __getattr__(name: str):
    # Imported on first use: a process that loads the package only to watch for torch_xla (autostart) stays light.
    if name in ("ExporterHandle", "attach", "detach"):
        from .training import attach

        return getattr(attach, name)
    raise AttributeError(f"module 'neuron_exporter' has no attribute {name!r}")
