"""Training loops whose batches the script counts itself, to hold ``training_samples_total`` and
``training_tokens_total`` against.

Usage: python throughput_train.py BACKEND

BACKEND is ``eager`` (the CPU), ``inductor`` (``torch.compile`` on the CPU) or ``xla`` (torch_xla on its CPU device).
A token model (an embedding and linears) trains on Hugging Face-style dict batches (``input_ids``, ``attention_mask``,
``labels``) from a DataLoader whose collate function pads each batch to its longest sequence, so that sequence lengths
change between batches and the last batch is shorter; then evaluates under ``torch.no_grad()`` (not training: not
counted). The cases, each measured as what the exporter's counters grew by:

- ``dict``: the dict batches (on ``xla``, through ``MpDeviceLoader``, whose own thread iterates the DataLoader);
- ``accumulation``: the same, 4 micro-batches per optimizer step;
- ``eager`` also: ``batch_size_none`` (a map dataset whose items are batches already, ``batch_size=None``),
  ``iterable_batches`` (an ``IterableDataset`` yielding batches, ``batch_size=None``), ``iterable_workers`` (an
  ``IterableDataset`` of single sequences shared out over 2 worker processes), ``tuples`` (``(ids, labels)``
  batches), ``nested`` (a DataLoader whose dataset draws its batches from another DataLoader on the same thread),
  ``vision`` (a torchvision ResNet on FakeData images: samples, no tokens; left out without torchvision).

Prints one JSON line: for each case, the counts exported (scraped from the rank's endpoint) and the script's own;
the ``training_peak_flops`` served, None if none; the exporter's failures on the training thread; and, on ``xla``,
whether counting device batches (taken, and still to compute) left torch_xla's counters and metrics as they were.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import tempfile
import urllib.request

import neuron_exporter

backend = sys.argv[1]
handle = neuron_exporter.attach(port=0, addr="127.0.0.1", spool_dir=tempfile.mkdtemp(), node_view=False)

import torch  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info  # noqa: E402

VOCABULARY, BATCH = 64, 4
SEQUENCES = 22  # 5 batches of 4 and a last one of 2
torch.manual_seed(0)

if backend == "xla":
    import torch_xla
    import torch_xla.distributed.parallel_loader as pl

    device = torch_xla.device()
else:
    device = torch.device("cpu")


def length(index: int) -> int:
    """Batches of 8 and 12 tokens in turn; every other sequence one shorter, padded."""
    return (8 if (index // BATCH) % 2 == 0 else 12) - index % 2


class Sequences(Dataset):
    def __len__(self) -> int:
        return SEQUENCES

    def __getitem__(self, index: int) -> dict:
        return {"input_ids": torch.randint(1, VOCABULARY, (length(index),))}


def pad(samples: list[dict]) -> dict:
    """A tokenizer's padding to the longest sequence of the batch: ids, a mask, and labels."""
    longest = max(len(sample["input_ids"]) for sample in samples)
    ids = torch.zeros(len(samples), longest, dtype=torch.int64)
    mask = torch.zeros(len(samples), longest, dtype=torch.int64)
    for row, sample in enumerate(samples):
        ids[row, : len(sample["input_ids"])] = sample["input_ids"]
        mask[row, : len(sample["input_ids"])] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def expected_padded(indices: list[int], batch: int = BATCH) -> tuple[int, int]:
    """Samples and tokens of ``indices`` taken in batches of ``batch``, each padded to its longest."""
    chunks = [indices[start : start + batch] for start in range(0, len(indices), batch)]
    return len(indices), sum(len(chunk) * max(length(index) for index in chunk) for chunk in chunks)


class TokenModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embedding = torch.nn.Embedding(VOCABULARY, 16)
        self.hidden = torch.nn.Linear(16, 32)
        self.out = torch.nn.Linear(32, VOCABULARY)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.hidden(self.embedding(input_ids))))


model = TokenModel().to(device)
step_model = torch.compile(model, backend="inductor") if backend == "inductor" else model
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)


def loss_of(batch: dict) -> torch.Tensor:
    logits = step_model(batch["input_ids"].to(device))
    return torch.nn.functional.cross_entropy(
        logits.reshape(-1, VOCABULARY), batch["labels"].to(device).reshape(-1), ignore_index=-100
    )


def end_step() -> None:
    optimizer.step()
    optimizer.zero_grad()
    if backend == "xla":
        torch_xla.sync()


def exported() -> tuple[int, int, float | None, float]:
    """Samples, tokens, the peak (None if not served) and the exporter's own failures on the training thread."""
    with urllib.request.urlopen(handle.url, timeout=30) as response:
        text = response.read().decode()
    values = {
        (sample.name, sample.labels.get("stage")): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
    return (
        int(values["training_samples_total", None]),
        int(values["training_tokens_total", None]),
        values.get(("training_peak_flops", None)),
        values["neuron_exporter_collection_errors_total", "step"],
    )


def batches(loader):
    """The loader's batches as the loop takes them: through MpDeviceLoader on torch_xla."""
    return pl.MpDeviceLoader(loader, device) if backend == "xla" else loader


def evaluate(loader) -> None:
    with torch.no_grad():
        for batch in batches(loader):
            loss_of(batch)


cases: dict[str, dict] = {}


def case(name: str, expected: tuple[int, int], train) -> None:
    before = exported()
    train()
    after = exported()
    cases[name] = {"exported": [after[0] - before[0], after[1] - before[1]], "expected": list(expected)}


def train_dict() -> None:
    loader = DataLoader(Sequences(), batch_size=BATCH, collate_fn=pad)
    for batch in batches(loader):
        loss_of(batch).backward()
        end_step()
    evaluate(loader)


def train_accumulation() -> None:
    loader = DataLoader(Sequences(), batch_size=BATCH, collate_fn=pad)
    for micro, batch in enumerate(batches(loader)):
        (loss_of(batch) / 4).backward()
        if micro % 4 == 3:
            end_step()
    end_step()


case("dict", expected_padded(list(range(SEQUENCES))), train_dict)
case("accumulation", expected_padded(list(range(SEQUENCES))), train_accumulation)


if backend == "eager":
    ROWS = (4, 3, 4, 1)  # the batches' sizes, as a dataset that batches itself makes them

    class Batched(Dataset):
        def __len__(self) -> int:
            return len(ROWS)

        def __getitem__(self, index: int) -> dict:
            return pad([{"input_ids": torch.randint(1, VOCABULARY, (6 + index,))} for _ in range(ROWS[index])])

    def train_on(loader) -> None:
        for batch in loader:
            loss_of(batch).backward()
            end_step()

    batched_tokens = sum(rows * (6 + index) for index, rows in enumerate(ROWS))
    case("batch_size_none", (sum(ROWS), batched_tokens), lambda: train_on(DataLoader(Batched(), batch_size=None)))

    class StreamOfBatches(IterableDataset):
        def __iter__(self):
            return iter(Batched()[index] for index in range(len(ROWS)))

    case(
        "iterable_batches",
        (sum(ROWS), batched_tokens),
        lambda: train_on(DataLoader(StreamOfBatches(), batch_size=None)),
    )

    class Stream(IterableDataset):
        """Single sequences of 10 tokens, shared out between the loader's workers."""

        def __iter__(self):
            worker = get_worker_info()
            share = range(SEQUENCES) if worker is None else range(worker.id, SEQUENCES, worker.num_workers)
            return iter({"input_ids": torch.randint(1, VOCABULARY, (10,))} for _ in share)

    case(
        "iterable_workers",
        (SEQUENCES, SEQUENCES * 10),
        lambda: train_on(DataLoader(Stream(), batch_size=BATCH, collate_fn=pad, num_workers=2)),
    )

    def train_tuples() -> None:
        data = torch.randint(1, VOCABULARY, (SEQUENCES, 7))
        loader = DataLoader(torch.utils.data.TensorDataset(data, data.roll(-1, dims=1)), batch_size=BATCH)
        for ids, labels in loader:
            loss_of({"input_ids": ids, "labels": labels}).backward()
            end_step()

    case("tuples", (SEQUENCES, SEQUENCES * 7), train_tuples)

    class FromLoader(IterableDataset):
        """The batches of another DataLoader, drawn on the same thread inside this one's ``next()``."""

        def __init__(self, inner: DataLoader) -> None:
            self.inner = inner

        def __iter__(self):
            return iter(self.inner)

    def train_nested() -> None:
        inner = DataLoader(Sequences(), batch_size=BATCH, collate_fn=pad)
        train_on(DataLoader(FromLoader(inner), batch_size=None))

    case("nested", expected_padded(list(range(SEQUENCES))), train_nested)

    if importlib.util.find_spec("torchvision") is not None:
        import torchvision

        def train_vision() -> None:
            images = torchvision.datasets.FakeData(
                size=10, image_size=(3, 32, 32), num_classes=10, transform=torchvision.transforms.ToTensor()
            )
            resnet = torchvision.models.resnet18(num_classes=10)
            vision_optimizer = torch.optim.SGD(resnet.parameters(), lr=0.01)
            for pixels, labels in DataLoader(images, batch_size=BATCH):
                torch.nn.functional.cross_entropy(resnet(pixels), labels).backward()
                vision_optimizer.step()
                vision_optimizer.zero_grad()

        case("vision", (10, 0), train_vision)

untouched = None
if backend == "xla":  # counting a device batch, taken or still to compute, runs, compiles and moves nothing
    import torch_xla.debug.metrics as met

    from neuron_exporter.training.throughput.batches import batch_counts

    def device_state() -> tuple:
        counters = {name: met.counter_value(name) for name in met.counter_names()}
        return counters, [met.metric_data(name) for name in ("CompileTime", "ExecuteTime", "TransferFromDeviceTime")]

    taken = next(iter(batches(DataLoader(Sequences(), batch_size=BATCH, collate_fn=pad))))
    pending = {"input_ids": taken["input_ids"] * 2, "labels": taken["labels"] + 1}  # not computed yet
    torch_xla.sync()
    before = device_state()
    counts = [batch_counts(taken) for _ in range(100)] + [batch_counts(pending) for _ in range(100)]
    untouched = device_state() == before and set(counts) == {(BATCH, BATCH * 8)}

_, _, peak, errors = exported()
print(json.dumps({"cases": cases, "peak": peak, "errors": errors, "untouched": untouched}), flush=True)
handle.detach()
