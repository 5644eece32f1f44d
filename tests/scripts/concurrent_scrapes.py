"""A real training loop scraped by many threads at once, with a tiny switch interval to make races likely.

Usage: python concurrent_scrapes.py STEPS SCRAPERS SPOOL_DIR

Prints one JSON line: torch_xla's own counter totals (before a clear_counters() in the middle, plus after it), the
last scrape over HTTP taken after the scrapers stopped, and how many scrapes ran while training. Then detaches
(writing the final spool report).
"""

from __future__ import annotations

import json
import sys
import threading
import urllib.request

import torch

import torch_xla
import torch_xla.debug.metrics as met

import neuron_exporter

steps, scrapers, spool_dir = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
handle = neuron_exporter.attach(port=0, addr="127.0.0.1", spool_dir=spool_dir, spool_interval_seconds=0.05)
sys.setswitchinterval(1e-4)

device = torch_xla.device()
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
stop = threading.Event()
scrapes = [0] * scrapers


def scrape_until_stopped(index: int) -> None:
    while not stop.is_set():
        with urllib.request.urlopen(handle.url, timeout=60) as response:
            response.read()
        scrapes[index] += 1


threads = [threading.Thread(target=scrape_until_stopped, args=(i,)) for i in range(scrapers)]
for thread in threads:
    thread.start()
before_clear = {}
for step in range(steps):
    x, y = torch.randn(8, 16).to(device), torch.randint(0, 4, (8,)).to(device)
    optimizer.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    torch_xla.sync()
    if step == steps // 2:
        # What counts between the exporter's last read and a clear is lost to it: read right before clearing.
        urllib.request.urlopen(handle.url, timeout=60).read()
        before_clear = {name: met.counter_value(name) for name in met.counter_names()}
        met.clear_counters()  # a user's clear in the middle of it: totals must carry on, not double
stop.set()
for thread in threads:
    thread.join()
sys.setswitchinterval(0.005)
after_clear = {name: met.counter_value(name) for name in met.counter_names()}
own = {name: before_clear.get(name, 0) + after_clear.get(name, 0) for name in before_clear.keys() | after_clear.keys()}
with urllib.request.urlopen(handle.url, timeout=60) as response:
    last = response.read().decode()
print(json.dumps({"xla": own, "scrape": last, "scrapes": sum(scrapes)}), flush=True)
neuron_exporter.detach()
