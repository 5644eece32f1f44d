"""The node endpoint: the spool every rank writes, the merged view of all ranks of a machine, host metrics and the
``serve`` daemon. Also used by a training rank that serves its machine. May import the top-level modules and ``web``;
never ``training`` (the daemon does not run torch) nor ``reports``.
"""
