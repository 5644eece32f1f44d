"""Attach the exporter right after a process imports torch_xla, without a line in the user's script.

``install()`` is called at interpreter start-up when ``NEURON_EXPORTER_AUTO=1``: by ``autostart_path/
sitecustomize.py`` (on ``PYTHONPATH`` under ``neuron-exporter run`` and in the children of an attached process)
and by the ``neuron_exporter_autostart.pth`` file an installed wheel puts in site-packages. It only adds an
import watcher: a process that never imports torch_xla loads nothing else of the exporter. After the import,
``attach()`` runs as if the script had called it, except that the process takes the HTTP port only once it trains
(the node endpoint is usually served by someone else).
"""

import sys

WATCHED = "torch_xla"


def _attach() -> None:
    try:
        from .attach import attach

        attach(_auto=True)
    except Exception as error:  # noqa: BLE001 (never stop the user's program)
        print(f"neuron-exporter: not attached: {type(error).__name__}: {error}", file=sys.stderr)


class _AttachAfterImport:
    """Finds nothing itself: it wraps the real loader of torch_xla so that ``attach()`` runs after the import.
    A plain object with ``find_spec`` (all ``sys.meta_path`` asks for): ``importlib.abc`` would cost every Python
    process of the environment tens of milliseconds at start-up (it imports ``importlib.resources``, ``typing``...).
    """

    def find_spec(self, name, path=None, target=None):
        if name != WATCHED:
            return None
        sys.meta_path.remove(self)
        import importlib.util

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
    if WATCHED in sys.modules:
        _attach()
    elif not any(isinstance(finder, _AttachAfterImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _AttachAfterImport())
