"""Saved reports, offline: the ``met.metrics_report()`` parser and the ``parse`` and ``explain`` commands
(``explain``: the step count, the findings and their text, a module each), and ``diagnose``.
May import the top-level modules only; never ``training``, ``node`` or ``web``.
"""
