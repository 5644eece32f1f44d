"""A fork while a thread of the parent reads the time ledger (holding the torch_xla source's lock for it): the child
must still read its own. Prints one JSON line: {"child": its exit status}.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading

import neuron_exporter

handle = neuron_exporter.attach(port=0, addr="127.0.0.1", spool_dir=tempfile.mkdtemp(), node_view=False)

import torch  # noqa: E402
from prometheus_client import generate_latest  # noqa: E402

import torch_xla  # noqa: E402

x = torch.randn(4, 4, device=torch_xla.device())
torch_xla.sync()  # the torch_xla source is started
xla = handle.sources.by_name["xla"]
reading, forked = threading.Event(), threading.Event()


def read_across_the_fork() -> None:
    with xla._seen_lock:  # as a read of the ledger holds it
        reading.set()
        forked.wait(60)


reader = threading.Thread(target=read_across_the_fork)
reader.start()
reading.wait(60)
pid = os.fork()
if pid == 0:
    threading.Timer(30, os._exit, (3,)).start()  # a child stuck on the lock exits 3
    text = generate_latest(handle._rank_registry).decode()
    os._exit(0 if "training_time_seconds_total" in text else 4)
forked.set()
reader.join()
_, status = os.waitpid(pid, 0)
handle.detach()
print(json.dumps({"child": os.waitstatus_to_exitcode(status)}))
