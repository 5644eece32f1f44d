"""The HTTP endpoint shared by a training rank and the node daemon, with its TLS and basic-auth web config.
May import the top-level modules only; never ``training``, ``node`` or ``reports``.
"""
