"""Every lock of the exporter in the training process is free in a forked child, whoever held it at the fork."""

from __future__ import annotations

import json
import os
import threading

import pytest

from neuron_exporter import fork_safe
from tests.support.paths import SCRIPTS
from tests.support.processes import run_python, xla_env


def test_a_lock_another_thread_holds_at_the_fork_is_free_in_the_child():
    locks = [fork_safe.Lock(), fork_safe.RLock()]
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        for lock in locks:
            lock.acquire()
        held.set()
        release.wait()
        for lock in locks:
            lock.release()

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait()
    pid = os.fork()
    if pid == 0:
        free = all(lock.acquire(timeout=5) for lock in locks)
        os._exit(0 if free else 1)
    release.set()
    holder.join()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert all(lock in fork_safe.every_lock() for lock in locks)


@pytest.mark.training
def test_a_child_forked_while_another_thread_holds_every_exporter_lock_trains_and_is_scraped():
    done = run_python(SCRIPTS / "fork_under_held_locks.py", env=xla_env(), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["child"] == 0 and result["locks_held"] >= 15, result
