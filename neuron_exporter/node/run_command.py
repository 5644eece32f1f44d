"""``neuron-exporter run -- COMMAND ...``: run any command with the exporter attached, without editing it.

Every Python process the command starts that imports torch_xla attaches itself (``NEURON_EXPORTER_AUTO`` and the
``sitecustomize`` of ``training/autostart_path`` on ``PYTHONPATH``), with the options given here; processes that never
import torch_xla are untouched. This process serves the node endpoint for the life of the command, passes signals
on to it, and exits with its exit code.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

from .. import run_identity
from ..config import AUTO_ENV, ENV_PREFIX, Options
from .node_view import NodeView
from .serve_command import add_options, load_options, node_server, prepare_spool_dir

log = logging.getLogger("neuron_exporter")
# A path, not an import: the training process's code is loaded by the command's own interpreters.
AUTOSTART_DIR = Path(__file__).resolve().parents[1] / "training" / "autostart_path"
FORWARDED = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
# The options the ranks need to find the spool and, if this process cannot serve, the port.
RANK_OPTIONS = ("addr", "port", "spool_dir", "spool_mode", "web_config_file", "log_level", "run_id")
EXIT_USAGE = 2


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "run", help="run a command with the exporter attached to every torch_xla process it starts",
        description="Run COMMAND (python train.py, torchrun ..., accelerate launch ...) with the exporter attached "
                    "in every Python process that imports torch_xla, and serve every rank on one /metrics "
                    "while it runs. Exits with COMMAND's exit code.")
    add_options(parser)
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND ...")
    parser.set_defaults(run=run)


def child_environment(options: Options, environ=os.environ) -> dict[str, str]:
    env = dict(environ)
    for key in RANK_OPTIONS:
        value = getattr(options, key)
        if value is not None:
            env[ENV_PREFIX + key.upper()] = str(value)
    env[AUTO_ENV] = "1"
    # Every process of the command is of one run, whatever launches it: this process's, unless one is given.
    env.setdefault(run_identity.RUN_ID_ENV, run_identity.run_id(environ))
    path = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = str(AUTOSTART_DIR) + (os.pathsep + path if path else "")
    return env


def run(args: argparse.Namespace) -> int:
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        print("neuron-exporter run: no command given (neuron-exporter run -- python train.py)", file=sys.stderr)
        return EXIT_USAGE
    loaded = load_options(args, "run")
    if isinstance(loaded, int):
        return loaded
    options, web_config = loaded
    problem = prepare_spool_dir(options)
    if problem:
        print(f"neuron-exporter run: {problem}", file=sys.stderr)
        return EXIT_USAGE
    server = None
    try:
        server = node_server(NodeView(options).start_reading(), options, web_config).start()
        print(f"neuron-exporter run: serving every rank on {server.url}", file=sys.stderr, flush=True)
    except OSError as error:
        log.warning("neuron-exporter run: cannot listen on %s:%s (%s); the ranks report to whoever holds it",
                    options.addr, options.port, error.strerror or error)
    try:
        child = subprocess.Popen(command, env=child_environment(options))
    except OSError as error:
        print(f"neuron-exporter run: cannot run {command[0]}: {error.strerror or error}", file=sys.stderr)
        return 127
    _forward_signals(child)
    code = child.wait()
    if server is not None:
        server.stop()
    return 128 - code if code < 0 else code


def _forward_signals(child: subprocess.Popen) -> None:
    def forward(signum, _frame):
        try:
            child.send_signal(signum)
        except OSError:
            pass

    for signum in FORWARDED:
        signal.signal(signum, forward)
    # Ctrl-C in a terminal reaches the whole foreground process group, the command too: forward only a SIGINT
    # sent to this process alone.
    signal.signal(signal.SIGINT, signal.SIG_IGN if sys.stdin.isatty() else forward)
