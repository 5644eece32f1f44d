"""Run by Python at the start of every process whose PYTHONPATH has this directory (set by ``neuron-exporter run``
and by ``attach()`` for its children): with ``NEURON_EXPORTER_AUTO=1``, the exporter attaches itself once the process
imports torch (see ``neuron_exporter/training/autostart.py``). The variable is read as the ``.pth`` file reads it
(``neuron_exporter.auto_enabled``), and ``python -I`` is left alone. The sitecustomize this file shadows, if any,
still runs.

The children inherit the variables whatever Python they run: one that cannot import the package (the system's
Python, a virtual environment not activated) says so, once, only if it imports torch (the process that was meant to
be attached), naming the interpreter and the fix; a tool or a hook that never imports torch stays silent.
"""

import importlib.machinery
import os
import sys

TRUE = ("1", "true", "yes", "on")  # neuron_exporter.TRUE, for a Python that cannot import the package


class _SayWhyNotAttached:
    """In ``sys.meta_path``: once the code of torch has run, writes ``message`` to stderr and leaves."""

    def __init__(self, message):
        self.message = message

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        for finder in list(sys.meta_path):  # the spec the other finders give, as the import system asks them
            find_spec = getattr(finder, "find_spec", None)
            spec = find_spec(name, path, target) if finder is not self and find_spec is not None else None
            if spec is not None:
                break
        else:
            return None  # no torch in this Python: its own error says enough
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_say(module):
            exec_module(module)
            if self in sys.meta_path:
                sys.meta_path.remove(self)
                sys.stderr.write(self.message)

        spec.loader.exec_module = exec_then_say
        return spec


def _not_importable(error) -> str:
    python = sys.executable or "this Python"
    return (
        f"neuron-exporter: not attached: {python} cannot import neuron_exporter ({type(error).__name__}: {error}); "
        f"install neuron-exporter into its environment ({python} -m pip install neuron-exporter), or run the "
        "command with the neuron-exporter of the environment that has it\n"
    )


def _install_autostart() -> None:
    if sys.flags.isolated or os.environ.get("NEURON_EXPORTER_AUTO", "").strip().lower() not in TRUE:
        return
    try:
        from neuron_exporter.training import autostart
    except Exception as error:  # noqa: BLE001 (never stop the user's program)
        sys.meta_path.insert(0, _SayWhyNotAttached(_not_importable(error)))
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
