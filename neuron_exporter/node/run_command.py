"""``neuron-exporter run -- COMMAND ...``: run any command with the exporter attached, without editing it.

Every Python process the command starts that imports torch_xla attaches itself (``NEURON_EXPORTER_AUTO`` and the
``sitecustomize`` of ``training/autostart_path`` on ``PYTHONPATH``), with the options given here; processes that never
import torch_xla are untouched. This process serves the node endpoint for the life of the command and owns its
processes, like an init: the command runs in a process group of its own (which gets the terminal, if this process
had it); every signal this process can catch is passed on to the command (but for its own SIGCHLD and the terminal's
job-control signals); as PID 1, or as the subreaper it makes itself, it reaps every orphan of the command; when the
command ends, what it left in its group gets SIGTERM, then SIGKILL after ``--grace-seconds``; it exits with the
command's exit code.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import time

from .. import run_identity
from ..config import child_environment
from ..training import AUTOSTART_DIR
from ..untrusted import EXIT_USAGE
from .node_view import NodeView
from .serve_command import add_options, load_options, node_server, prepare_spool_dir

log = logging.getLogger("neuron_exporter")
# Signals not passed on: its own children's, the terminal's job control (the command's group has the terminal), and
# faults, which a Python handler cannot survive (the faulting instruction would run again and again).
NOT_FORWARDED = {
    signal.SIGCHLD,
    signal.SIGTTIN,
    signal.SIGTTOU,
    signal.SIGSEGV,
    signal.SIGBUS,
    signal.SIGFPE,
    signal.SIGILL,
    signal.SIGTRAP,
    signal.SIGSYS,
    signal.SIGKILL,
    signal.SIGSTOP,
}
PR_SET_CHILD_SUBREAPER, PR_SET_PDEATHSIG = 36, 1
DEFAULT_GRACE_SECONDS = 10.0
KILL_WAIT_SECONDS = 5.0  # after SIGKILL, for the group's last members to be gone
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
    if problem:
        print(f"neuron-exporter run: {problem}", file=sys.stderr)
        return EXIT_USAGE
    server = None
    try:
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
        return Supervisor(command, env, grace).run()
    except OSError as error:
        print(f"neuron-exporter run: cannot run {command[0]}: {error.strerror or error}", file=sys.stderr)
        return 127
    finally:
        if server is not None:
            server.stop()


def _seconds(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if 0 <= value <= 3600 else None


class Supervisor:
    """Runs the command in a process group of its own and owns everything it starts (see the module's doc)."""

    def __init__(self, command: list[str], env: dict[str, str], grace_seconds: float):
        self.command, self.env, self.grace_seconds = command, env, grace_seconds
        self.child: subprocess.Popen | None = None

    def run(self) -> int:
        _prctl(PR_SET_CHILD_SUBREAPER, 1)  # orphans of the command become this process's, to reap and to end
        terminal = _foreground_terminal()
        parent = os.getpid()

        def in_child():  # after fork, before exec
            os.setpgid(0, 0)
            _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # this process killed by SIGKILL: the command goes too
            if os.getppid() != parent:
                os._exit(128 + signal.SIGKILL)

        self._handle_signals()
        self.child = subprocess.Popen(self.command, env=self.env, preexec_fn=in_child)
        _give_terminal(terminal, self.child.pid)
        try:
            status = self._wait(self.child.pid, terminal)
        finally:
            _give_terminal(terminal, os.getpgrp())
        self._end_group(self.child.pid)
        code = os.waitstatus_to_exitcode(status)
        return 128 - code if code < 0 else code

    def _handle_signals(self) -> None:
        def forward(signum, _frame):
            if self.child is not None:
                try:
                    os.kill(self.child.pid, signum)
                except OSError:
                    pass

        for signum in signal.valid_signals() - NOT_FORWARDED:
            try:
                signal.signal(signum, forward)
            except (OSError, ValueError):  # one the C library keeps for itself
                pass

    @staticmethod
    def _wait(pid: int, terminal: int | None) -> int:
        """Reap children, orphans included, until ``pid`` ends; its wait status. Stopped from the terminal
        (Ctrl-Z), the command's stop is this process's too, for the shell; continued, so is the command."""
        while True:
            reaped, status = os.waitpid(-1, os.WUNTRACED)
            if reaped != pid:
                continue
            if not os.WIFSTOPPED(status):
                return status
            if terminal is not None:
                _give_terminal(terminal, os.getpgrp())
                os.kill(os.getpid(), signal.SIGSTOP)
                _give_terminal(terminal, pid)
                os.killpg(pid, signal.SIGCONT)

    def _end_group(self, group: int) -> None:
        """SIGTERM to what the command left in its group, SIGKILL after the grace period; reap what ends."""
        try:
            os.killpg(group, signal.SIGTERM)
        except OSError:  # nothing left
            return
        deadline = time.monotonic() + self.grace_seconds
        killed = False
        while True:
            _reap_ready()
            now = time.monotonic()
            if now >= deadline + KILL_WAIT_SECONDS:
                return
            signum = signal.SIGKILL if now >= deadline and not killed else 0  # 0: is the group still there?
            try:
                os.killpg(group, signum)
            except OSError:  # the group is gone (or has only members of another user, not ours to end)
                return
            killed = killed or signum == signal.SIGKILL
            time.sleep(0.02)


def _reap_ready() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _foreground_terminal() -> int | None:
    """The fd of this process's terminal, if its group is in the foreground there (it is run from a shell)."""
    try:
        return 0 if os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp() else None
    except OSError:
        return None


def _give_terminal(fd: int | None, group: int) -> None:
    if fd is None:
        return
    ignored = signal.signal(signal.SIGTTOU, signal.SIG_IGN)  # or, in the background, this process would stop
    try:
        os.tcsetpgrp(fd, group)
    except OSError:
        pass
    finally:
        signal.signal(signal.SIGTTOU, ignored)


def _prctl(option: int, value: int) -> None:
    """Linux prctl(2); nothing elsewhere."""
    if _libc is not None:
        _libc.prctl(option, value, 0, 0, 0)


try:
    import ctypes

    _libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
except (ImportError, OSError):
    _libc = None
