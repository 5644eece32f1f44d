"""The parent of a ``neuron-exporter run`` command: it owns every process the command starts and ends them all.

Why a process of its own, between the runner and the command: the runner can be killed with SIGKILL, and then it
can do nothing. PR_SET_PDEATHSIG takes its child along, but not the processes that child started, nor one that left
the command's process group with ``setsid``: Linux has no "end my descendants when I die" for an ordinary process
(only the init of a PID namespace, or a cgroup, has it). So the runner starts this keeper, and the keeper starts the
command. The keeper is the command's child subreaper (PR_SET_CHILD_SUBREAPER): whatever process group or session
they move to, the command's processes stay in its tree, an orphan becoming the keeper's child. So every one of them
can be found in /proc by its parent, and none is left once the keeper has no child. When the command ends, what it
left gets SIGTERM, then SIGKILL after the grace period. When the runner dies, the keeper learns it from
PR_SET_PDEATHSIG (SIGHUP, its parent then no longer the runner) and sends SIGKILL to the whole tree, as the runner's
SIGKILL meant. It is in a process group of its own: a signal to the runner's group (a shell's ``kill %1``) or from
the terminal (Ctrl-C goes to the command's group) does not reach it, so the command gets no signal twice and the
keeper outlives the runner. The runner is a child subreaper too: the keeper killed with SIGKILL takes the command
along (its PR_SET_PDEATHSIG), and what the command started comes to the runner, which ends it. Only both killed at
once leave processes behind; a PID namespace or a cgroup is the answer there.

As PID 1 of a PID namespace, the runner is the command's parent itself (``Keeper`` in its own process): the kernel
ends every process of the namespace with it, and every orphan of the namespace comes to it to be reaped.

Signals: the keeper passes on to the command every signal it can catch (but for its own SIGCHLD, the terminal's
job-control signals and faults). One that comes before the command runs is not lost: the runner holds (blocks) them
from before it starts the keeper, which inherits that, until the command has started; then they are passed on.
Stopped from the terminal (Ctrl-Z), the command's stop is the keeper's too, for the runner and the shell; continued,
so is the command's group. The command's group gets the terminal before the command runs (or a command that reads
at once, ``cat``, would stop). The keeper exits with the command's exit code.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable

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
FORWARDED = signal.valid_signals() - NOT_FORWARDED
PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER = 1, 36
RUNNER_GONE = signal.SIGHUP  # the keeper's PR_SET_PDEATHSIG: its handler then finds its parent is not the runner
KILL_WAIT_SECONDS = 5.0  # after SIGKILL, for the last processes to be gone
POLL_SECONDS = 0.02
EXIT_CANNOT_RUN = 127


class Keeper:
    """Runs the command in a process group of its own and owns everything it starts (see the module's doc)."""

    def __init__(
        self,
        command: list[str],
        env: dict[str, str] | None,
        grace_seconds: float,
        terminal: int | None,
        home_group: int,
        runner: int | None = None,
    ):
        """``terminal``: the fd of the terminal to give the command's group while it runs and back to
        ``home_group`` when it stops; ``runner``: the pid of the runner, this keeper's parent, whose death ends
        every process (None: this process is the runner)."""
        self.command, self.env, self.grace_seconds = command, env, grace_seconds
        self.terminal, self.home_group, self.runner = terminal, home_group, runner
        self.child: subprocess.Popen | None = None
        self.ended = False  # the command reaped: its pid is no longer its own
        self.paused = False  # stopped with the command: continued, it gives the terminal before the SIGCONT
        self.pending: list[int] = []  # signals that came before the command was started, for it once it is

    def run(self) -> int:
        """The command's exit code (128 + N if a signal N ended it); OSError if it cannot start."""
        prctl(PR_SET_CHILD_SUBREAPER, 1)
        forward_signals(self._forward)
        hold_signals()  # held by the runner already; what comes until the command runs is passed on then
        if self.runner is not None:
            prctl(PR_SET_PDEATHSIG, RUNNER_GONE)
            self._check_runner()  # it may have died before the line above
        parent, terminal = os.getpid(), self.terminal

        def in_child():  # after fork, before exec
            os.setpgid(0, 0)
            if terminal is not None:  # SIGTTOU is held here: a group not in the foreground may take the terminal
                signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTTOU})
                try:
                    os.tcsetpgrp(terminal, os.getpid())
                except OSError:
                    pass
            signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED | {signal.SIGTTOU})
            prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # this process killed by SIGKILL: the command goes too
            if os.getppid() != parent:
                os._exit(128 + signal.SIGKILL)

        try:
            self.child = subprocess.Popen(self.command, env=self.env, preexec_fn=in_child)
        finally:
            release_signals()
        give_terminal(self.terminal, self.child.pid)
        for signum in self.pending:
            self._forward(signum, None)
        try:
            status = wait_for(self.child.pid, self._stopped if self.terminal is not None else None)
        finally:
            give_terminal(self.terminal, self.home_group)
        self.ended = True
        end_all(self.child.pid, self.grace_seconds)
        return exit_code(status)

    def _forward(self, signum: int, _frame) -> None:
        self._check_runner()
        if self.child is None:  # another thread took it (as PID 1, the runner's server has threads)
            self.pending.append(signum)
        elif not self.ended and not (self.paused and signum == signal.SIGCONT):
            try:
                os.kill(self.child.pid, signum)
            except OSError:
                pass

    def _check_runner(self) -> None:
        if self.runner is not None and os.getppid() != self.runner:
            end_all(self.child.pid if self.child is not None else None, 0)
            os._exit(128 + signal.SIGKILL)

    def _stopped(self, pid: int) -> None:
        """The command stopped from the terminal: give it back and stop; continued, continue the command."""
        self.paused = True
        give_terminal(self.terminal, self.home_group)
        os.kill(os.getpid(), signal.SIGSTOP)
        give_terminal(self.terminal, pid)
        self.paused = False
        os.killpg(pid, signal.SIGCONT)


def forward_signals(forward: Callable[[int, object], None]) -> None:
    for signum in FORWARDED:
        try:
            signal.signal(signum, forward)
        except (OSError, ValueError):  # one the C library keeps for itself
            pass


def hold_signals() -> None:
    """Block the signals that are passed on: they wait, pending, until ``release_signals()``."""
    signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)


def release_signals() -> None:
    signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)


def wait_for(pid: int, stopped: Callable[[int], None] | None) -> int:
    """Reap children, orphans included, until ``pid`` ends; its wait status. ``stopped(pid)`` when it stops."""
    while True:
        reaped, status = os.waitpid(-1, os.WUNTRACED)
        if reaped != pid:
            continue
        if not os.WIFSTOPPED(status):
            return status
        if stopped is not None:
            stopped(pid)


def exit_code(status: int) -> int:
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


def end_all(group: int | None, grace_seconds: float) -> None:
    """End every process below this one (and the process group ``group``): SIGTERM, SIGKILL after the grace
    period; reap them. Done when this process has no child left, or KILL_WAIT_SECONDS after the SIGKILL (what is
    left then is another user's, not ours to end)."""
    deadline = time.monotonic() + grace_seconds
    if grace_seconds > 0:
        _signal_all(group, signal.SIGTERM)
    while _has_children() and time.monotonic() < deadline:
        time.sleep(POLL_SECONDS)
    while _has_children() and time.monotonic() < deadline + KILL_WAIT_SECONDS:
        _signal_all(group, signal.SIGKILL)  # again and again: a process may have forked since
        time.sleep(POLL_SECONDS)


def _signal_all(group: int | None, signum: int) -> None:
    if group is not None:
        try:
            os.killpg(group, signum)
        except OSError:  # gone already
            pass
    for pid in descendants(os.getpid()):
        try:
            os.kill(pid, signum)
        except OSError:
            pass


def _has_children() -> bool:
    """Reap the children that have ended; whether any is left."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return False
        if pid == 0:
            return True


def descendants(root: int) -> list[int]:
    """The pids of the processes below ``root``, from /proc (none where there is no /proc)."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdecimal():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):  # ended meanwhile
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))  # after "pid (comm)": state, ppid
    found, todo = [], [root]
    while todo:
        below = children.get(todo.pop(), [])
        found.extend(below)
        todo.extend(below)
    return found


def give_terminal(fd: int | None, group: int) -> None:
    if fd is None:
        return
    ignored = signal.signal(signal.SIGTTOU, signal.SIG_IGN)  # or, in the background, this process would stop
    try:
        os.tcsetpgrp(fd, group)
    except OSError:
        pass
    finally:
        signal.signal(signal.SIGTTOU, ignored)


def prctl(option: int, value: int) -> None:
    """Linux prctl(2); nothing elsewhere."""
    if _libc is not None:
        _libc.prctl(option, value, 0, 0, 0)


try:
    import ctypes

    _libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
except (ImportError, OSError):
    _libc = None


def main(argv: list[str]) -> int:
    """``python -m neuron_exporter.cli.command_keeper RUNNER GRACE TERMINAL_HOME COMMAND ...``, as the runner starts
    it, in the command's environment: TERMINAL_HOME is the runner's process group if it has the terminal (fd 0)
    to give the command, else ``-``."""
    os.setpgid(0, 0)
    runner, grace, home, command = int(argv[0]), float(argv[1]), argv[2], argv[3:]
    terminal = None if home == "-" else 0
    keeper = Keeper(command, None, grace, terminal, int(home) if terminal is not None else os.getpgrp(), runner)
    try:
        return keeper.run()
    except OSError as error:
        print(f"neuron-exporter run: cannot run {command[0]}: {error.strerror or error}", file=sys.stderr)
        return EXIT_CANNOT_RUN


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
