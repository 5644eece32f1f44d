"""Attach the exporter in a process once it imports torch_xla, without a line in the user's script.

Installed by ``autostart/sitecustomize.py``. The import of torch_xla runs as usual; right after it, ``attach()``
runs as if the script had called it, with the options of the ``NEURON_EXPORTER_*`` variables, except that the
process takes the HTTP port only once it trains (the node endpoint is usually served by someone else).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import logging
import sys

log = logging.getLogger("neuron_exporter")
MODULE = "torch_xla"


def _attach() -> None:
    try:
        from .attach import attach

        attach(_auto=True)
    except Exception as error:  # noqa: BLE001 (a bad option must not stop the user's program)
        print(f"neuron-exporter: not attached: {error}", file=sys.stderr)


class _TorchXlaImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: it wraps the real loader of torch_xla so that ``attach()`` runs after the import."""

    def find_spec(self, name, path=None, target=None):
        if name != MODULE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_attach(module):
            exec_module(module)
            _attach()

        spec.loader.exec_module = exec_then_attach
        return spec


def install() -> None:
    if MODULE in sys.modules:
        _attach()
    elif not any(isinstance(finder, _TorchXlaImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _TorchXlaImport())
