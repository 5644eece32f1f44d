"""attach() in a CPU training job (torch only) on a machine whose instance id comes from the metadata service.

    instance_id_attach.py DMI_FILE

The DMI file is ``DMI_FILE`` (one that does not exist: the metadata service is asked) and the metadata service is
``AWS_EC2_METADATA_SERVICE_ENDPOINT``, given a timeout longer than any test, so that only its answer ends the
look-up. Right after ``attach()`` returns, prints one JSON line ({"url": ..., "looked_up": whether the look-up had
ended}), trains a few steps, then keeps stepping every 0.1 s until its standard input closes.
"""

from __future__ import annotations

import json
import sys
import tempfile
import threading
from pathlib import Path

import torch

import neuron_exporter
from neuron_exporter.training import instance_id

instance_id.DMI_ASSET_TAG = Path(sys.argv[1])
instance_id.TIMEOUT_SECONDS = 600.0
handle = neuron_exporter.attach(port=0, addr="127.0.0.1", spool_dir=tempfile.mkdtemp(), node_view=False)
print(json.dumps({"url": handle.url, "looked_up": handle.device_join.instance_id.done}), flush=True)
model = torch.nn.Linear(4, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)


def step() -> None:
    optimizer.zero_grad()
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()


released = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), released.set()), daemon=True).start()
while not released.wait(0.1):
    step()
