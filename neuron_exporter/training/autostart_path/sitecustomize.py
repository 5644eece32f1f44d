"""Run by Python at the start of every process whose PYTHONPATH has this directory (set by ``neuron-exporter run``
and by ``attach()`` for its children): with ``NEURON_EXPORTER_AUTO=1``, the exporter attaches itself once the process
imports torch (see ``neuron_exporter/training/autostart.py``). The variable is read as the ``.pth`` file reads it
(``neuron_exporter.auto_enabled``), and ``python -I`` is left alone. The sitecustomize this file shadows, if any,
still runs.
"""

import importlib.machinery
import os
import sys


def _install_autostart() -> None:
    if sys.flags.isolated or not os.environ.get("NEURON_EXPORTER_AUTO"):
        return
    try:
        import neuron_exporter

        if not neuron_exporter.auto_enabled(os.environ):
            return
        from neuron_exporter.training import autostart
    except Exception as error:  # noqa: BLE001 (never stop the user's program)
        print(f"neuron-exporter: cannot attach in this process: {type(error).__name__}: {error}", file=sys.stderr)
        return
    autostart.install()


def _run_shadowed_sitecustomize() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    path = [entry for entry in sys.path if os.path.abspath(entry or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is not None and spec.loader is not None:
        from importlib.util import module_from_spec

        module = module_from_spec(spec)
        spec.loader.exec_module(module)


_install_autostart()
_run_shadowed_sitecustomize()
