"""Saved reports, offline: the ``met.metrics_report()`` parser and the ``parse`` and ``explain`` commands.
May import the top-level modules only; never ``training``, ``node`` or ``web``.
"""
