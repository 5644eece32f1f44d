"""Attach the exporter right after a process imports torch, without a line in the user's script.

``install()`` is called at interpreter start-up when ``NEURON_EXPORTER_AUTO=1``: by ``autostart_path/
sitecustomize.py`` (on ``PYTHONPATH`` under ``neuron-exporter run`` and in the children of an attached process)
and by the ``neuron_exporter_autostart.pth`` file an install puts in site-packages. It only adds an
import watcher: a process that never imports torch loads nothing else of the exporter. After the import,
``attach()`` runs as if the script had called it, except that the process takes the HTTP port only once it trains
(the node endpoint is usually served by someone else); torch_xla's and torch.compile's sources start when those are
imported in turn. Every process that imports torch is attached, but only one that trains or compiles claims a rank.
"""

import sys

from .import_watch import after_import

WATCHED = "torch"


def _attach() -> None:
    try:
        from .attach import attach

        attach(_auto=True)
    except Exception as error:  # noqa: BLE001 (never stop the user's program)
        print(f"neuron-exporter: not attached: {type(error).__name__}: {error}", file=sys.stderr)


def install() -> None:
    after_import(WATCHED, _attach)
