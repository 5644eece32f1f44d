"""Runs inside the training process: ``attach()``, the step-marker hook, the reading of torch_xla's counters and
the rank's own collector. Every line here can cost the user a step, so it stays small and off the hot path.
May import the top-level modules, ``node`` (to write the spool and serve the node view) and ``web``; never ``reports``.
"""
