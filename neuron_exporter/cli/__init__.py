"""The ``neuron-exporter`` command: ``parse`` and ``explain`` (reports/), ``serve`` the node endpoint (node/), and,
here, ``run`` a command with the exporter attached (it starts training processes), ``diagnose`` (a client of a live
endpoint) and ``assets``. This package puts the commands together, and no other folder imports it."""

from __future__ import annotations

import argparse
import os
import sys

from .. import __version__
from ..config import ENV_PREFIX, OPTION_NAMES, flag
from ..node import serve_command
from ..reports import report_commands


class CommandParser(argparse.ArgumentParser):
    """A command's parser: an argument it does not know is an error of that command, with its usage (not the
    top-level one); a flag named after an option says how the option is set."""

    def parse_known_args(self, args=None, namespace=None):
        namespace, unknown = super().parse_known_args(args, namespace)
        if unknown:
            self.error(f"unrecognized arguments: {' '.join(unknown)}{self._hint(unknown)}")
        return namespace, unknown

    def _hint(self, unknown: list[str]) -> str:
        keys = self._defaults.get("option_keys")
        if keys is None:
            return ""
        for argument in unknown:
            key = argument.split("=", 1)[0].lstrip("-").replace("-", "_").replace(".", "_")
            if argument.startswith("-") and key in OPTION_NAMES:
                if key in keys:
                    return f" (the flag of the option {key} is {flag(key)})"
                return (
                    f"; {self.prog.split()[-1]} does not use the option {key}: the training processes read it from "
                    f"{ENV_PREFIX}{key.upper()} or the configuration key {key}, and take it from "
                    f"neuron-exporter run {flag(key)}"
                )
        return ""


def build_parser() -> argparse.ArgumentParser:
    """The ``neuron-exporter`` command line, every command registered."""
    # Imported here, not at the top: `run` starts its keeper as ``python -m neuron_exporter.cli.command_keeper``,
    # which imports this package first, and must not find itself imported already (runpy warns).
    from . import assets_command, diagnose_command, run_command

    parser = argparse.ArgumentParser(
        prog="neuron-exporter",
        description="Prometheus metrics for PyTorch training: goodput, graph fragmentation, recompiles, CPU-fallback "
        "operators.",
    )
    parser.add_argument("--version", action="version", version=f"neuron-exporter {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=CommandParser)
    report_commands.register(commands)
    serve_command.register(commands)
    run_command.register(commands)
    diagnose_command.register(commands)
    assets_command.register(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
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
