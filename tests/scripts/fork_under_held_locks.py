"""A fork while another thread holds every lock the exporter has in the training process: the child must train and
be scraped as if nothing were held. Prints one JSON line: the child's exit status and the locks held at the fork.

The locks are found the way a fork finds them, not from the exporter's own list: every lock object that a module or
an object of neuron_exporter refers to. The patching lock is left free: the fork itself takes it (a child never
inherits a patch half made), so holding it would only make the fork wait.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import sys
import tempfile
import threading
import types

import neuron_exporter

handle = neuron_exporter.attach(port=0, addr="127.0.0.1", spool_dir=tempfile.mkdtemp(), node_view=False)

import torch  # noqa: E402
from prometheus_client import generate_latest  # noqa: E402

from neuron_exporter.training import patching  # noqa: E402

model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), 8)


def train(steps: int) -> None:
    for step, (x, y) in zip(range(steps), loader, strict=False):
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
        if step % 2:
            torch.save(model.state_dict(), os.devnull)


train(4)
generate_latest(handle._rank_registry)  # every part read once: every family and its locks exist

LOCK_TYPES = (type(threading.Lock()), type(threading.RLock()))


def is_lock(value) -> bool:
    return isinstance(value, LOCK_TYPES) or type(value).__name__ == "Lock" and hasattr(value, "acquire")


def exporter_locks() -> list:
    found: dict[int, object] = {}
    owners = [module for name, module in sys.modules.items() if name.startswith("neuron_exporter")]
    owners += [o for o in gc.get_objects() if str(getattr(type(o), "__module__", "")).startswith("neuron_exporter")]
    for owner in owners:
        if is_lock(owner):
            continue  # what a lock wraps is that lock
        values = vars(owner).values() if hasattr(owner, "__dict__") else ()
        slots = [getattr(owner, slot, None) for slot in getattr(type(owner), "__slots__", ())]
        for value in [*values, *slots]:
            if is_lock(value) and not isinstance(value, types.ModuleType):
                found[id(value)] = value
    return [lock for lock in found.values() if lock is not patching._lock]


locks = exporter_locks()
held, release = threading.Event(), threading.Event()


def hold_every_lock() -> None:
    while True:  # all at once: the spool thread takes some of them in its own order
        taken = []
        for lock in locks:
            if not lock.acquire(timeout=0.01):
                break
            taken.append(lock)
        if len(taken) == len(locks):
            break
        for lock in reversed(taken):
            lock.release()
    held.set()
    release.wait()
    for lock in reversed(locks):
        lock.release()


holder = threading.Thread(target=hold_every_lock, daemon=True)
holder.start()
held.wait()
pid = os.fork()
if pid == 0:
    signal.alarm(60)  # a child stuck on a lock exits by the alarm's signal, not never
    train(4)
    text = generate_latest(neuron_exporter.training.attach._current._rank_registry).decode()
    assert "training_time_seconds_total" in text and "training_steps_total" in text, text[:2000]
    handle.detach()
    os._exit(0)
release.set()
_, status = os.waitpid(pid, 0)
handle.detach()
print(json.dumps({"child": os.waitstatus_to_exitcode(status), "locks_held": len(locks)}), flush=True)
