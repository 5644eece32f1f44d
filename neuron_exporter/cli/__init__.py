"""The ``neuron-exporter`` command: ``parse`` and ``explain`` (reports/), ``serve`` the node endpoint (node/), and,
here, ``run`` a command with the exporter attached (it starts training processes), ``diagnose`` (a client of a live
endpoint) and ``assets``. This package puts the commands together, and no other folder imports it."""

from __future__ import annotations

import argparse
import os
import sys

from .. import __version__
from ..node import serve_command
from ..reports import report_commands
from . import assets_command, diagnose_command, run_command


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="neuron-exporter",
        description="Prometheus metrics for PyTorch/XLA training: fragmentation, recompiles, CPU-fallback operators.",
    )
    parser.add_argument("--version", action="version", version=f"neuron-exporter {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    report_commands.register(commands)
    serve_command.register(commands)
    run_command.register(commands)
    diagnose_command.register(commands)
    assets_command.register(commands)
    args = parser.parse_args(argv)
    try:
        code = args.run(args)
        sys.stdout.flush()  # here, where a closed pipe is handled below, not at exit
        return code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader of the output is gone (| head): say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit flush does not fail too
        return 1
    except Exception as error:  # noqa: BLE001 (a bug: bad input has its own one-line error; this must stay one line)
        print(f"neuron-exporter: internal error: {error!r:.300}; please report it", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
