"""`neuron-exporter run` owns the command's processes: it passes on every signal it can catch, reaps orphans as
PID 1, ends what the command left in its group, and exits with the command's status. Real processes and signals."""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import sys

import psutil
import pytest

from neuron_exporter.node import command_keeper
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
