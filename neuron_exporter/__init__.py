"""neuron-exporter: Prometheus metrics for PyTorch training, on any backend (eager, torch.compile, torch_xla,
TorchNeuron).

``neuron_exporter.attach()`` hooks every step of a training loop and serves ``/metrics``.
The package imports without torch; only ``attach()`` needs it, and it reads torch_xla, torch.compile and TorchNeuron
where the process imports them.
"""

__version__ = "0.1.0"

__all__ = ["ExporterHandle", "attach", "detach", "__version__"]

# How a boolean option reads text (``config``), and with it NEURON_EXPORTER_AUTO: here, because the ``.pth`` file and
# ``training/autostart_path/sitecustomize.py`` read that variable at the start of every Python process, where
# importing ``config`` would cost too much.
TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off")
AUTO_ENV = "NEURON_EXPORTER_AUTO"  # attach in every process that imports torch (see training/autostart.py)


def auto_enabled(environ) -> bool:
    """Whether ``NEURON_EXPORTER_AUTO`` in ``environ`` is true as a boolean option reads it (anything else, unset
    or not a boolean, is off: it is read in every Python process, where it cannot stop with an error)."""
    return environ.get(AUTO_ENV, "").strip().lower() in TRUE


def __getattr__(name: str):
    # Imported on first use: a process that loads the package only to watch for torch (autostart) stays light.
    if name in ("ExporterHandle", "attach", "detach"):
        from .training import attach

        return getattr(attach, name)
    raise AttributeError(f"module 'neuron_exporter' has no attribute {name!r}")
