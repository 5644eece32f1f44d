"""``neuron-exporter run -- COMMAND ...``: run any command with the exporter attached, without editing it.

Every Python process the command starts that imports torch attaches itself (``NEURON_EXPORTER_AUTO`` and the
``sitecustomize`` of ``training/autostart_path`` on ``PYTHONPATH``), with the options given here; processes that never
import torch are untouched. This process, the runner, serves the node endpoint for the life of the command and
exits with the command's exit code. A keeper process (``command_keeper``, which says why) is the command's parent and
owns its processes, like an init: the command runs in a process group of its own (which gets the terminal, if the
runner had it); every signal the runner can catch is passed on to the command through the keeper; it reaps every
orphan of the command; when the command ends, every process it left, in any group or session, gets SIGTERM, then
SIGKILL after ``--grace-seconds``; when the runner is killed with SIGKILL, they all get SIGKILL at once. As PID 1 of a
PID namespace, the runner is the keeper itself: the kernel ends the namespace with it.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys

from .. import run_identity
from ..config import child_environment
from ..training import AUTOSTART_DIR
from ..untrusted import EXIT_USAGE
from . import command_keeper
from .command_keeper import (
    EXIT_CANNOT_RUN,
    PR_SET_CHILD_SUBREAPER,
    Keeper,
    end_all,
    exit_code,
    forward_signals,
    hold_signals,
    prctl,
    release_signals,
    wait_for,
)
from .node_view import NodeView
from .serve_command import add_options, load_options, node_server, prepare_spool_dir

log = logging.getLogger("neuron_exporter")
DEFAULT_GRACE_SECONDS = 10.0
# The options the ranks need to find the spool and, if this process cannot serve, the port.
RANK_OPTIONS = ("addr", "port", "spool_dir", "spool_mode", "web_config_file", "log_level", "run_id")


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "run",
        help="run a command with the exporter attached to every torch_xla process it starts",
        description="Run COMMAND (python train.py, torchrun ..., accelerate launch ...) with the exporter attached "
        "in every Python process that imports torch_xla, and serve every rank on one /metrics "
        "while it runs. Exits with COMMAND's exit code.",
    )
    add_options(parser)
    parser.add_argument(
        "--grace-seconds",
        metavar="SECONDS",
        default=str(DEFAULT_GRACE_SECONDS),
        help="when COMMAND ends, how long the processes it left get between SIGTERM and SIGKILL "
        f"(default {DEFAULT_GRACE_SECONDS:g})",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND ...")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        print("neuron-exporter run: no command given (neuron-exporter run -- python train.py)", file=sys.stderr)
        return EXIT_USAGE
    grace = _seconds(args.grace_seconds)
    if grace is None:
        print(
            f"neuron-exporter run: --grace-seconds: expected a number of seconds from 0 to 3600, got "
            f"{args.grace_seconds!r:.100}",
            file=sys.stderr,
        )
        return EXIT_USAGE
    loaded = load_options(args, "run")
    if isinstance(loaded, int):
        return loaded
    options, web_config = loaded
    problem = prepare_spool_dir(options)
    server = None
    try:
        if problem:
            # Another user's file must not cost the job: it runs, and the port is left to its ranks, the first of
            # which serves itself there, with neuron_exporter_spool_directory_ok 0 (the alert fires).
            print(
                f"neuron-exporter run: {problem}; running the command anyway, its ranks do not share the spool: "
                "the rank that holds the port serves itself only",
                file=sys.stderr,
                flush=True,
            )
        else:
            server = node_server(NodeView(options).start_reading(), options, web_config).start()
            print(f"neuron-exporter run: serving every rank on {server.url}", file=sys.stderr, flush=True)
    except OSError as error:
        log.warning(
            "neuron-exporter run: cannot listen on %s:%s (%s); the ranks report to whoever holds it",
            options.addr,
            options.port,
            error.strerror or error,
        )
    try:
        values = {key: getattr(options, key) for key in RANK_OPTIONS}
        # Every process of the command is of one run, whatever launches it: this process's, unless one is given.
        env = child_environment(values, options.run_id or run_identity.run_id(), AUTOSTART_DIR)
        return supervise(command, env, grace)
    except OSError as error:
        print(f"neuron-exporter run: cannot run {command[0]}: {error.strerror or error}", file=sys.stderr)
        return EXIT_CANNOT_RUN
    finally:
        if server is not None:
            server.stop()


def _seconds(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if 0 <= value <= 3600 else None


def supervise(command: list[str], env: dict[str, str], grace_seconds: float) -> int:
    """Run the command under a keeper; the command's exit code."""
    terminal = _foreground_terminal()
    if os.getpid() == 1 or not sys.platform.startswith("linux"):
        return Keeper(command, env, grace_seconds, terminal, os.getpgrp()).run()
    home = str(os.getpgrp()) if terminal is not None else "-"
    keeper: subprocess.Popen | None = None
    reaped = False
    pending: list[int] = []  # held signals reach this process through its server's threads: for the keeper

    def forward(signum, _frame):
        if keeper is None:
            pending.append(signum)
        elif not reaped:
            try:
                os.kill(keeper.pid, signum)
            except OSError:
                pass

    def stopped(pid: int) -> None:  # the keeper stopped with the command: so does this process, for the shell
        os.kill(os.getpid(), signal.SIGSTOP)
        os.kill(pid, signal.SIGCONT)

    forward_signals(forward)
    prctl(PR_SET_CHILD_SUBREAPER, 1)  # a keeper killed with SIGKILL leaves its orphans to this process
    hold_signals()  # until the keeper is there to take them; it starts with them held (command_keeper says why)
    try:
        keeper = subprocess.Popen(
            [sys.executable, "-m", command_keeper.__name__, str(os.getpid()), repr(grace_seconds), home, *command],
            env=env,
        )
    finally:
        release_signals()
    for signum in pending:
        forward(signum, None)
    status = wait_for(keeper.pid, stopped if terminal is not None else None)
    reaped = True
    end_all(None, grace_seconds)  # nothing is left but where the keeper was killed: what it kept then ends here
    return exit_code(status)


def _foreground_terminal() -> int | None:
    """The fd of this process's terminal, if its group is in the foreground there (it is run from a shell)."""
    try:
        return 0 if os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp() else None
    except OSError:
        return None
