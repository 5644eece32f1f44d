"""The ``neuron-exporter`` command: ``parse`` and ``explain`` saved reports, ``serve`` the node endpoint."""

from __future__ import annotations

import argparse
import sys

from . import __version__
from .node import serve_command
from .reports import report_commands


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="neuron-exporter",
        description="Prometheus metrics for PyTorch/XLA training: fragmentation, recompiles, CPU-fallback operators.",
    )
    parser.add_argument("--version", action="version", version=f"neuron-exporter {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    report_commands.register(commands)
    serve_command.register(commands)
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
