"""Attach the exporter right after a process imports torch, without a line in the user's script.

``install()`` is called at interpreter start-up when ``NEURON_EXPORTER_AUTO=1``: by ``autostart_path/
sitecustomize.py`` (on ``PYTHONPATH`` under ``neuron-exporter run`` and in the children of an attached process) and
by the ``neuron_exporter_autostart.pth`` file an install puts in site-packages. It only adds an import watcher: a
process that never imports torch loads nothing else of the exporter. After the import, ``attach()`` runs as if the
script had called it, except that the process takes the HTTP port only once it trains (the node endpoint is usually
served by someone else); each source (torch.compile's, torch_xla's, TorchNeuron's) starts when its library is
imported in turn. Every process that imports torch is attached, but only one that trains or compiles claims a rank.
A script that imports ``neuron_exporter.attach`` before torch attaches itself, with its own options: zero code then
steps aside.
"""

import sys

from .import_watch import after_import

WATCHED = "torch"
ATTACH_MODULE = __name__.rpartition(".")[0] + ".attach"


def _attach() -> None:
    module = sys.modules.get(ATTACH_MODULE)
    if module is not None and getattr(getattr(module, "__spec__", None), "_initializing", False):
        # torch is imported by the exporter's attach module on its way in: the script imports neuron_exporter.attach
        # to attach itself, with its own options, which an attachment made here would take the place of.
        return
    try:
        from .attach import attach

        attach(_auto=True)
    except Exception as error:  # noqa: BLE001 (never stop the user's program)
        print(f"neuron-exporter: not attached: {type(error).__name__}: {error}", file=sys.stderr)


def install() -> None:
    after_import(WATCHED, _attach)
