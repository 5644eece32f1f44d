"""A real torch_xla training loop with the exporter attached, for the benchmarks that scrape it while it trains
(``node_scale.py``, ``scrape_under_load.py``).

    PJRT_DEVICE=CPU python benchmarks/scraped_trainer.py SPOOL_DIR STOP_FILE [job|rank]

``job`` (the default) serves the node view from the job's endpoint process, ``rank`` the process's own metrics. After
200 steps it prints ``{"url": ...}``; it trains until STOP_FILE reads ``stop`` (looked at every 100 steps), then
prints ``{"times": [...]}``, the monotonic time at the end of every step.
"""

import json
import sys
import time

import torch

import torch_xla

import neuron_exporter

spool_dir, stop_file = sys.argv[1:3]
node_view = sys.argv[3:] != ["rank"]
handle = neuron_exporter.attach(port=0, addr="127.0.0.1", spool_dir=spool_dir, node_view=node_view)
device = torch_xla.device()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(32, 64).to(device), torch.randint(0, 10, (32,)).to(device)
times: list[float] = []
while True:
    optimizer.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()
    torch_xla.sync()
    times.append(time.monotonic())
    if len(times) == 200:
        print(json.dumps({"url": handle.url}), flush=True)
    if len(times) % 100 == 0 and open(stop_file).read() == "stop":
        break
print(json.dumps({"times": times}), flush=True)
