"""One torch_xla graph of a few thousand operations, whose compilation takes seconds, with the rank's endpoint scraped
from a thread of the script while the step marker compiles it.

Usage: python long_xla_compile.py [--ops 2000]

Prints one JSON line: the ``compile`` phase of each scrape served while the step marker ran (started after it
began, answered before it returned), the exporter's ``compile`` after ``detach()``, and torch_xla's own
``CompileTime`` total, in seconds.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import urllib.request

import neuron_exporter

parser = argparse.ArgumentParser()
parser.add_argument("--ops", type=int, default=2000)
args = parser.parse_args()
handle = neuron_exporter.attach(port=0, addr="127.0.0.1", spool_dir=tempfile.mkdtemp(), node_view=False)

import torch  # noqa: E402
from prometheus_client import generate_latest  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

import torch_xla  # noqa: E402
import torch_xla.debug.metrics as met  # noqa: E402


def compile_phase() -> float:
    with urllib.request.urlopen(handle.url, timeout=60) as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "training_time_seconds_total" and sample.labels["phase"] == "compile":
                return sample.value
    raise LookupError("no training_time_seconds_total{phase='compile'}")


in_marker = threading.Event()
marker_done = threading.Event()
during: list[float] = []


def scrape_during_the_marker() -> None:
    in_marker.wait()
    while not marker_done.is_set():
        seconds = compile_phase()
        if not marker_done.is_set():  # answered before the marker returned: served while it compiled
            during.append(seconds)
        marker_done.wait(0.02)


scraper = threading.Thread(target=scrape_during_the_marker)
scraper.start()
x = torch.randn(32, 32, device=torch_xla.device())
for i in range(args.ops):
    x = torch.tanh(x @ x.T * 0.01 + i) + torch.sin(x * (i + 1))
in_marker.set()
torch_xla.sync()
marker_done.set()
scraper.join()
handle.detach()
exported = {
    sample.labels["phase"]: sample.value
    for family in text_string_to_metric_families(generate_latest(handle._rank_registry).decode())
    for sample in family.samples
    if sample.name == "training_time_seconds_total"
}
print(
    json.dumps(
        {"during": during, "exported": exported["compile"], "compile_time": met.metric_data("CompileTime")[1] / 1e9}
    )
)
