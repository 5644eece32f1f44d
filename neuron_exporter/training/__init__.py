"""Runs inside the training process: ``attach()``, the step-marker hook, the reading of torch_xla's counters and
the rank's own collector. Every line here can cost the user a step, so it stays small and off the hot path.
May import the top-level modules, ``node`` (to write the spool and serve the node view) and ``web``; never ``reports``.
"""

import os

# Where this package's start-up files are (a path, not an import, so that the launchers that name it load nothing of
# training): on PYTHONPATH, its sitecustomize attaches a process that imports torch when NEURON_EXPORTER_AUTO is set.
AUTOSTART_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "autostart_path")
