"""Runs inside the training process: ``attach()``, the sources (one sub-package each, behind the contract of ``source``:
``steps/``, ``phases/``, ``throughput/``, ``torch_compile/``, ``xla/``, ``neuron/``), what they share (patching, import
watching, the input pipelines' entry points, host reads, sites, attribution, the ledger of the training thread's time)
and the rank's own collector. Every line here can cost the user a step, so it stays small and off the hot path. May
import the top-level modules, ``node`` (to write the spool and serve the node view) and ``web``; never ``reports``.
Sibling sources never import each other.
"""

import os

# Where this package's start-up files are (a path, not an import, so that the launchers that name it load nothing of
# training): on PYTHONPATH, its sitecustomize attaches a process that imports torch when NEURON_EXPORTER_AUTO is set.
AUTOSTART_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "autostart_path")
