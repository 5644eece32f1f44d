"""attach()/detach() life cycle and failure handling in one real torch_xla process.

Prints one JSON object of observations; tests/training/test_attach_lifecycle.py asserts on it.
Faults are injected into the exporter's own reader (never into torch_xla) to show that a failure inside the
exporter is counted and logged while the loop goes on.
"""

from __future__ import annotations

import json
import socket
import sys
import tempfile
import urllib.request

import torch
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import torch_xla

import neuron_exporter

device = torch_xla.device()
model = torch.nn.Linear(8, 2).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)  # made before attach(): seen at its first step
spool_dir = tempfile.mkdtemp()
seen: dict = {}


def train(steps: int) -> None:
    for _ in range(steps):
        optimizer.zero_grad()
        model(torch.randn(4, 8).to(device)).sum().backward()
        optimizer.step()
        torch_xla.sync()


def values(exposition: str) -> dict[str, float]:
    """{'name{label=value,...}': value} with labels sorted, for easy lookup."""
    result = {}
    for family in text_string_to_metric_families(exposition):
        for s in family.samples:
            labels = ",".join(
                f"{k}={v}" for k, v in sorted(s.labels.items()) if k not in ("rank", "local_rank", "run_id")
            )
            result[f"{s.name}{{{labels}}}"] = s.value
    return result


original = torch_xla._XLAC._xla_step_marker

handle = neuron_exporter.attach(port=0, addr="127.0.0.1", spool_dir=spool_dir)
seen["second_attach_is_same_handle"] = neuron_exporter.attach(port=0) is handle
seen["hooked_while_attached"] = torch_xla._XLAC._xla_step_marker is not original
seen["port_bound"] = isinstance(handle.port, int) and handle.port > 0 and str(handle.port) in handle.url
train(3)
url = handle.url
seen["steps_while_attached"] = values(urllib.request.urlopen(url).read().decode())["xla_steps_total{}"]
neuron_exporter.detach()
seen["restored_after_detach"] = torch_xla._XLAC._xla_step_marker is original
try:
    urllib.request.urlopen(url, timeout=5)
    seen["endpoint_closed_after_detach"] = False
except OSError:
    seen["endpoint_closed_after_detach"] = True

with neuron_exporter.attach(port=0, addr="127.0.0.1", spool_dir=spool_dir) as handle:
    seen["new_handle_after_detach"] = handle.port is not None
    train(2)
    seen["steps_in_context"] = values(urllib.request.urlopen(handle.url).read().decode())["xla_steps_total{}"]
seen["restored_after_context"] = torch_xla._XLAC._xla_step_marker is original

# A port already in use: attach() still hooks the loop and falls back to the spool; nothing raises.
busy = socket.socket()
busy.bind(("127.0.0.1", 0))
busy.listen()
registry = CollectorRegistry()
handle = neuron_exporter.attach(port=busy.getsockname()[1], addr="127.0.0.1", registry=registry, spool_dir=spool_dir)
seen["busy_port_handle_port"] = handle.port
train(3)
seen["busy_port_steps"] = values(generate_latest(registry).decode())["xla_steps_total{}"]


# Failures inside the exporter: the step hook's reader, then the scrape-time snapshot.
def broken(*args):
    raise RuntimeError("injected failure")


handle.detach()
handle = neuron_exporter.attach(port=0, addr="127.0.0.1", spool_dir=spool_dir)
handle.sources.get("xla").reader.counter_value = broken
train(3)
handle.sources.get("xla").reader.snapshot = broken
response = urllib.request.urlopen(handle.url)
scraped = values(response.read().decode())
seen["broken_scrape_status"] = response.status
seen["broken_step_errors"] = scraped["neuron_exporter_collection_errors_total{stage=step}"]
seen["broken_scrape_errors"] = scraped["neuron_exporter_collection_errors_total{stage=scrape}"]
seen["broken_xla_collector_success"] = scraped["neuron_exporter_collector_success{collector=xla}"]
seen["broken_steps_collector_success"] = scraped["neuron_exporter_collector_success{collector=steps}"]
seen["broken_scrape_still_has_process_metrics"] = all(
    f"{prefix}_process_resident_memory_bytes{{}}" in scraped
    for prefix in ("training", "xla")  # xla_: one release more
)
handle.detach()

print(json.dumps(seen), flush=True)
sys.exit(0)
