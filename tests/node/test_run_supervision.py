"""`neuron-exporter run` owns the command's processes: it passes on every signal it can catch, reaps orphans as
PID 1, ends what the command left in its group, and exits with the command's status. Real processes and signals."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import shutil
import signal
import subprocess
import sys
import termios

import psutil
import pytest

from neuron_exporter.cli import command_keeper
from tests.support.paths import ROOT
from tests.support.processes import wait_until

CLI = [sys.executable, "-m", "neuron_exporter"]


def runner_command(tmp_path, command: list[str], *options: str) -> list[str]:
    return CLI + [
        "run",
        "--addr",
        "127.0.0.1",
        "--port",
        "0",
        "--spool-dir",
        str(tmp_path / "spool"),
        *options,
        "--",
        *command,
    ]


def start(tmp_path, command: list[str], *options: str) -> subprocess.Popen:
    return subprocess.Popen(
        runner_command(tmp_path, command, *options),
        env=environment(),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def environment() -> dict[str, str]:
    return {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT)}


def line_from(process: subprocess.Popen, timeout: float = 60.0) -> str:
    ready, _, _ = select.select([process.stdout], [], [], timeout)
    if not ready:
        pytest.fail(f"no line from the command in {timeout}s")
    return process.stdout.readline().strip()


# The command prints the number of every signal it gets; SIGTERM ends it with status 5.
RECEIVER = """
import os, signal, sys
def got(signum, frame):
    os.write(1, b"%d\\n" % signum)
    if signum == signal.SIGTERM:
        sys.exit(5)
for signum in signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP}:
    try:
        signal.signal(signum, got)
    except (OSError, ValueError):
        pass
print("up", flush=True)
while True:
    signal.pause()
"""


def test_every_catchable_signal_is_passed_on_and_the_runner_keeps_running(tmp_path):
    process = start(tmp_path, [sys.executable, "-c", RECEIVER])
    sent = sorted(signal.valid_signals() - command_keeper.NOT_FORWARDED - {signal.SIGTERM})
    try:
        assert line_from(process) == "up"
        for signum in sent:  # SIGALRM, SIGVTALRM, SIGPROF, SIGXCPU... each once
            process.send_signal(signum)
            assert line_from(process) == str(int(signum)), (signum, process.poll())
            assert process.poll() is None, signum
        process.send_signal(signal.SIGTERM)
        assert line_from(process) == str(int(signal.SIGTERM))
        assert process.wait(timeout=60) == 5
    finally:
        process.kill()
        process.wait()
    assert {signal.SIGALRM, signal.SIGVTALRM, signal.SIGPROF, signal.SIGXCPU, signal.SIGINT} <= set(sent)


# Starts the command under the runner (``supervise``) or the keeper alone, with a signal sent to itself just as the
# process that takes it on is being started: the command must get it (and end of it), not run on as if none came.
# ``thread``: another thread runs, which the kernel may hand the signal to instead (the runner's server has threads).
EARLY_SIGNAL = """
import os, signal, subprocess, sys, threading
from neuron_exporter.cli import command_keeper, run_command
where, thread = sys.argv[1:]
if thread == "thread":
    threading.Thread(target=threading.Event().wait, daemon=True).start()
real_popen = subprocess.Popen
def signalled_popen(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGTERM)
    subprocess.Popen = real_popen
    return real_popen(*args, **kwargs)
subprocess.Popen = signalled_popen
command = [sys.executable, "-c", "import time; time.sleep(120)"]
if where == "runner":
    sys.exit(run_command.supervise(command, dict(os.environ), 1.0))
sys.exit(command_keeper.Keeper(command, None, 1.0, None, os.getpgrp()).run())
"""


@pytest.mark.parametrize("thread", ["", "thread"])
@pytest.mark.parametrize("where", ["runner", "keeper"])
def test_a_signal_that_comes_before_the_command_runs_is_passed_on(tmp_path, where, thread):
    result = subprocess.run(
        [sys.executable, "-c", EARLY_SIGNAL, where, thread or "-"],
        env=environment(),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=110,  # before the command would end by itself
    )
    assert result.returncode == 128 + signal.SIGTERM, result.stderr[-2000:]


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_what_a_forking_command_leaves_is_ended_and_its_status_is_the_runners(tmp_path):
    process = start(tmp_path, ["sh", "-c", "for i in $(seq 200); do sleep 600 & echo $! >> pids; done; exit 3"])
    try:
        assert process.wait(timeout=120) == 3, process.stderr.read()
    finally:
        process.kill()
    pids = [int(line) for line in (tmp_path / "pids").read_text().split()]
    assert len(pids) == 200
    left = [pid for pid in pids if not gone(pid)]
    for pid in left:  # not to leave them behind when the test fails
        os.kill(pid, signal.SIGKILL)
    assert left == []


def test_a_process_that_ignores_sigterm_gets_sigkill_after_the_grace_period(tmp_path):
    script = "(trap '' TERM; exec sleep 600) & echo $! > pids; exit 4"
    process = start(tmp_path, ["sh", "-c", script], "--grace-seconds", "0.5")
    try:
        assert process.wait(timeout=120) == 4, process.stderr.read()
    finally:
        process.kill()
    pid = int((tmp_path / "pids").read_text())
    if not gone(pid):
        os.kill(pid, signal.SIGKILL)
        pytest.fail("the process that ignores SIGTERM was left running")


def test_the_command_ends_with_a_runner_killed_by_sigkill(tmp_path):
    process = start(
        tmp_path, [sys.executable, "-c", "import os, time; print(os.getpid(), flush=True); time.sleep(600)"]
    )
    try:
        command = int(line_from(process))
        process.kill()
        process.wait()
        wait_until(lambda: gone(command), timeout=30, what="the command to end with its runner")
    finally:
        process.kill()
        if not gone(command):
            os.kill(command, signal.SIGKILL)


# The command starts a child, which starts a grandchild in a session of its own, as a daemon does; each prints its
# role and pid once it is in place, then waits.
FAMILY = """
import os, signal
def arrived(role):
    os.write(1, b"%s %d\\n" % (role, os.getpid()))
arrived(b"command")
if os.fork() == 0:
    arrived(b"child")
    if os.fork() == 0:
        os.setsid()
        arrived(b"grandchild")
while True:
    signal.pause()
"""


def test_nothing_the_command_started_outlives_a_runner_killed_by_sigkill(tmp_path):
    process = start(tmp_path, [sys.executable, "-c", FAMILY])
    family: set[int] = set()
    try:
        pids = dict(line_from(process).split() for _ in range(3))
        grandchild = int(pids["grandchild"])
        assert os.getsid(grandchild) == grandchild != os.getsid(int(pids["command"]))
        family = {child.pid for child in psutil.Process(process.pid).children(recursive=True)}
        assert {int(pid) for pid in pids.values()} <= family
        process.kill()
        process.wait()
        wait_until(lambda: all(gone(pid) for pid in family), timeout=30, what="the command's processes to end")
    finally:
        process.kill()
        for pid in family:  # not to leave them behind when the test fails
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)


# The command starts a process in a session of its own and exits 3 once it is there.
DAEMON = """
import os, signal, sys
read, write = os.pipe()
pid = os.fork()
if pid == 0:
    os.setsid()
    os.write(write, b"x")
    while True:
        signal.pause()
os.read(read, 1)
print(pid, flush=True)
sys.exit(3)
"""


def test_a_process_in_a_session_of_its_own_is_ended_with_the_command(tmp_path):
    process = start(tmp_path, [sys.executable, "-c", DAEMON])
    try:
        assert process.wait(timeout=120) == 3, process.stderr.read()
    finally:
        process.kill()
    pid = int(line_from(process))
    if not gone(pid):
        os.kill(pid, signal.SIGKILL)
        pytest.fail("the process in a session of its own was left running")


# The command echoes the lines it reads from the terminal.
ECHO = """
import sys
print("up", flush=True)
for line in sys.stdin:
    print("got", line.strip(), flush=True)
"""


def run_on_a_terminal(tmp_path, command: list[str], typed_ahead: bytes = b"") -> tuple[subprocess.Popen, int]:
    """The runner of ``command`` leading a session on a new terminal (as a shell starts it), and that terminal's
    other end, on which ``typed_ahead`` was typed before the runner started."""
    terminal, runner_side = pty.openpty()
    os.write(terminal, typed_ahead)
    process = subprocess.Popen(
        runner_command(tmp_path, command),
        env=environment(),
        stdin=runner_side,
        stdout=runner_side,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0),
    )
    os.close(runner_side)
    return process, terminal


def test_ctrl_z_stops_the_runner_with_the_command_and_fg_gives_the_command_the_terminal_again(tmp_path):
    """The test is the shell: the runner leads a session on a terminal of its own."""
    process, terminal = run_on_a_terminal(tmp_path, [sys.executable, "-c", ECHO])
    try:
        output = Output(terminal)
        output.wait_for(b"up")
        os.write(terminal, b"\x1a")  # Ctrl-Z
        _, status = os.waitpid(process.pid, os.WUNTRACED)
        assert os.WIFSTOPPED(status)
        os.kill(process.pid, signal.SIGCONT)  # fg: the runner's group has the terminal again, the keeper gave it
        os.write(terminal, b"one\n")  # read by a command in the background, it would stop again (SIGTTIN)
        output.wait_for(b"got one")
        os.write(terminal, b"\x03")  # Ctrl-C: to the command's group only
        _, status = os.waitpid(process.pid, 0)
        assert os.waitstatus_to_exitcode(status) == 128 + signal.SIGINT
    finally:
        process.kill()
        os.close(terminal)


def test_a_command_that_reads_the_terminal_at_once_has_it(tmp_path):
    """cat reads its terminal as soon as it runs: its group must have the terminal by then, or it stops (SIGTTIN)."""
    process, terminal = run_on_a_terminal(tmp_path, ["cat"], typed_ahead=b"early\n")  # waiting before cat starts
    try:
        output = Output(terminal)
        output.wait_for(b"early\r\nearly")  # the terminal's echo, then cat's copy
        os.write(terminal, b"\x04")  # end of input: cat ends
        _, status = os.waitpid(process.pid, os.WUNTRACED)
        assert not os.WIFSTOPPED(status), "the command stopped for the terminal, and the runner with it"
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        process.kill()
        os.close(terminal)


class Output:
    def __init__(self, fd: int):
        self.fd, self.text = fd, b""

    def wait_for(self, text: bytes, timeout: float = 60.0) -> None:
        while text not in self.text:
            ready, _, _ = select.select([self.fd], [], [], timeout)
            if not ready:
                pytest.fail(f"no {text!r} from the command in {timeout}s, only {self.text!r}")
            self.text += os.read(self.fd, 4096)
        self.text = self.text[self.text.index(text) + len(text) :]


# As PID 1, the command makes 100 orphans that end at once, then waits until no process but itself and PID 1 is
# left (the orphans reaped) or 30 s have passed, and prints how many are left and its parent.
ORPHANS = """
import os, time
for _ in range(100):
    if os.fork() == 0:
        if os.fork() == 0:
            os._exit(0)  # an orphan once its parent has ended
        os._exit(0)
    os.wait()
def others():
    return [p for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, os.getpid())]
deadline = time.monotonic() + 30
while others() and time.monotonic() < deadline:
    time.sleep(0.05)
print(len(others()), os.getppid(), flush=True)
"""


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root and unshare")
def test_as_pid_1_every_orphan_is_reaped(tmp_path):
    command = ["unshare", "--pid", "--fork", "--mount-proc"] + runner_command(tmp_path, [sys.executable, "-c", ORPHANS])
    result = subprocess.run(command, env=environment(), cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["0", "1"], (result.stdout, result.stderr)  # none left; the runner is PID 1


def test_a_bad_grace_period_is_one_line_and_exit_2(tmp_path):
    result = subprocess.run(
        runner_command(tmp_path, ["true"], "--grace-seconds", "soon"),
        env=environment(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "--grace-seconds" in result.stderr


def test_a_command_that_cannot_start_is_one_line_and_exit_127(tmp_path):
    result = subprocess.run(
        runner_command(tmp_path, [str(tmp_path / "missing")]),
        env=environment(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 127, result.stderr
    assert f"cannot run {tmp_path / 'missing'}: No such file or directory\n" in result.stderr
    assert "Traceback" not in result.stderr
