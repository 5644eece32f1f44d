"""A token model (an embedding and two linears) trained on Hugging Face-style dict batches from a DataLoader, a
shorter batch now and then, for ``training_flops_total`` against the model's FLOPs from its shapes: 6 per token and
weight of its linears (2 forward, 4 backward; the embedding is a lookup).

Usage: python flops_train.py BACKEND [--vision] [--detached] [--with-torch-xla]

BACKEND: ``eager`` (the CPU), ``inductor`` (``torch.compile``), ``xla`` (torch_xla's CPU device, through
``MpDeviceLoader``), ``neuron`` (the emulated TorchNeuron device of tests/support/torchneuron). With ``--vision``, a
torchvision ResNet on image batches too, whose FLOPs the script counts by ``FlopCounterMode`` on a copy of it on the
CPU, forward and backward, batch by batch. With ``--with-torch-xla``, torch_xla is imported but not trained on, as
the Hugging Face Trainer imports it wherever it is installed.

Prints one JSON line: the FLOPs and samples exported (scraped from the rank's endpoint) and expected, for the token
model and the vision model, the exporter's failures on the training thread, and on ``xla`` the compilations (with
``--detached``, of the same run without the exporter, to compare).
"""

from __future__ import annotations

import copy
import json
import sys
import tempfile
import urllib.request
from pathlib import Path

import neuron_exporter

backend = sys.argv[1]
if backend == "neuron":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support" / "torchneuron"))
detached = "--detached" in sys.argv
handle = (
    None
    if detached
    else neuron_exporter.attach(port=0, addr="127.0.0.1", spool_dir=tempfile.mkdtemp(), node_view=False)
)

import torch  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

VOCABULARY, WIDTH, HIDDEN = 512, 64, 256
SIZES = [8, 8, 8, 5, 8, 8, 8, 8, 3, 8, 8, 8]  # batch sizes: a shorter one now and then
SEQUENCE = 32
torch.manual_seed(0)

if "--with-torch-xla" in sys.argv:
    import torch_xla

if backend == "xla":
    import torch_xla
    import torch_xla.debug.metrics as met
    import torch_xla.distributed.parallel_loader as pl

    device = torch_xla.device()
elif backend == "neuron":
    import torch_neuronx  # noqa: F401

    device = torch.device("neuron")
else:
    device = torch.device("cpu")


class Batches(Dataset):
    """Each item a batch of ``SIZES[index]`` sequences, as a Hugging Face collator makes them."""

    def __len__(self) -> int:
        return len(SIZES)

    def __getitem__(self, index: int) -> dict:
        ids = torch.randint(0, VOCABULARY, (SIZES[index], SEQUENCE))
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}


def exported() -> dict[str, float]:
    if handle is None:
        return {"flops": 0.0, "samples": 0.0, "tokens": 0.0, "errors": 0.0}
    with urllib.request.urlopen(handle.url, timeout=30) as response:
        text = response.read().decode()
    values = {
        (sample.name, sample.labels.get("stage")): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
    return {
        "flops": values["training_flops_total", None],
        "samples": values["training_samples_total", None],
        "tokens": values["training_tokens_total", None],
        "errors": values["neuron_exporter_collection_errors_total", "step"],
    }


model = torch.nn.Sequential(
    torch.nn.Embedding(VOCABULARY, WIDTH),
    torch.nn.Linear(WIDTH, HIDDEN),
    torch.nn.ReLU(),
    torch.nn.Linear(HIDDEN, VOCABULARY),
).to(device)
step_model = torch.compile(model) if backend == "inductor" else model
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
loader = DataLoader(Batches(), batch_size=None)
batches = pl.MpDeviceLoader(loader, device) if backend == "xla" else loader
for _ in range(2):  # two epochs
    for batch in batches:
        logits = step_model(batch["input_ids"].to(device))
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCABULARY), batch["labels"].to(device).reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if backend == "xla":
            torch_xla.sync()
tokens = 2 * sum(SIZES) * SEQUENCE
expected = {"expected": 6 * tokens * (WIDTH * HIDDEN + HIDDEN * VOCABULARY), "expected_samples": 2 * sum(SIZES)}
result = {"token": {**exported(), **expected, "expected_tokens": tokens}}

if "--vision" in sys.argv:
    import torchvision
    from torch.utils.flop_counter import FlopCounterMode

    before = exported()
    resnet = torchvision.models.resnet18(num_classes=10)
    reference = copy.deepcopy(resnet)
    resnet = resnet.to(device)
    step_resnet = torch.compile(resnet) if backend == "inductor" else resnet
    optimizer = torch.optim.SGD(resnet.parameters(), lr=0.01)
    images = [(torch.randn(size, 3, 32, 32), torch.randint(0, 10, (size,))) for size in (4, 4, 2, 4, 4)]
    vision = pl.MpDeviceLoader(DataLoader(images, batch_size=None), device) if backend == "xla" else images
    expected = 0
    for x, y in images:  # the reference, on the CPU, without a loader: not training, to the exporter
        with FlopCounterMode(display=False) as counter:
            torch.nn.functional.cross_entropy(reference(x), y).backward()
        expected += counter.get_total_flops()
    for x, y in vision if backend == "xla" else DataLoader(images, batch_size=None):
        torch.nn.functional.cross_entropy(step_resnet(x.to(device)), y.to(device)).backward()
        optimizer.step()
        optimizer.zero_grad()
        if backend == "xla":
            torch_xla.sync()
    after = exported()
    result["vision"] = {
        "flops": after["flops"] - before["flops"],
        "samples": after["samples"] - before["samples"],
        "expected": expected,
        "expected_samples": sum(len(y) for _, y in images),
    }

result["errors"] = exported()["errors"]
if backend == "xla":
    result["compilations"] = met.metric_data("CompileTime")[0]
print(json.dumps(result), flush=True)
if handle is not None:
    handle.detach()
