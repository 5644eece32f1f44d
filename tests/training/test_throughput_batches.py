"""What a batch counts (``throughput.batches``): samples from the leading dimension of the tensor it is counted by,
tokens from that tensor when it holds token ids; a bounded walk, whatever the batch holds."""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterator, Mapping

import pytest
import torch

from neuron_exporter.training.throughput.batches import MAX_ITEMS, batch_counts, counted_tensor

B, S = 4, 9


def ids(*shape: int, dtype=torch.int64) -> torch.Tensor:
    return torch.randint(0, 100, shape, dtype=dtype)


def hf_batch() -> dict:
    return {"input_ids": ids(B, S), "attention_mask": torch.ones(B, S, dtype=torch.int64), "labels": ids(B, S)}


class BatchEncoding(collections.UserDict):
    """The shape of Hugging Face's ``BatchEncoding``: a mapping that is not a dict."""


@dataclasses.dataclass
class Batch:
    pixel_values: torch.Tensor
    input_ids: torch.Tensor


@pytest.mark.parametrize(
    ("batch", "expected"),
    [
        pytest.param(hf_batch(), (B, B * S), id="hf dict: input_ids only, not mask nor labels"),
        pytest.param(BatchEncoding(hf_batch()), (B, B * S), id="BatchEncoding"),
        pytest.param(
            {"attention_mask": torch.ones(B, S + 1, dtype=torch.int64), "input_ids": ids(B, S)},
            (B, B * S),
            id="input_ids wherever it is in the mapping",
        ),
        pytest.param(
            {"pixel_values": torch.randn(B, 3, 8, 8), "input_ids": ids(B, S)}, (B, B * S), id="image and text"
        ),
        pytest.param(ids(B, S), (B, B * S), id="LongTensor[B, S]"),
        pytest.param(ids(B, S, dtype=torch.int32), (B, B * S), id="IntTensor[B, S]"),
        pytest.param((ids(B, S), ids(B, S)), (B, B * S), id="(ids, labels): the ids"),
        pytest.param([ids(B, S), ids(B)], (B, B * S), id="[ids, labels]"),
        pytest.param({"tokens": ids(B, S), "targets": ids(B, S)}, (B, B * S), id="dict without input_ids: first"),
        pytest.param(({"input_ids": ids(B, S)}, ids(B)), (B, B * S), id="nested mapping"),
        pytest.param(Batch(torch.randn(B, 3, 8, 8), ids(B, S)), (B, 0), id="dataclass: its first field"),
        pytest.param((torch.randn(B, 3, 32, 32), ids(B)), (B, 0), id="images and labels: samples only"),
        pytest.param(torch.randint(0, 255, (B, 3, 8, 8), dtype=torch.uint8), (B, 0), id="uint8 pixels"),
        pytest.param((torch.randn(B, 3, 8, 8), ids(B, 8, 8)), (B, 0), id="segmentation masks after the images"),
        pytest.param(ids(B), (B, 0), id="one dimension: no tokens"),
        pytest.param(ids(B, S, dtype=torch.int16), (B, 0), id="int16 is not token ids"),
        pytest.param(torch.tensor(3.0), (1, 0), id="0-dimensional: one sample"),
        pytest.param(["a text", "another"], (0, 0), id="no tensor: nothing"),
        pytest.param({"text": ["a", "b"], "input_ids": [1, 2]}, (0, 0), id="input_ids that is no tensor"),
        pytest.param(None, (0, 0), id="None"),
        pytest.param(((), [], {}, ids(B, S)), (B, B * S), id="empty containers first"),
        pytest.param(("skip", 3, b"x", ids(B, S)), (B, B * S), id="scalars and strings first"),
    ],
)
def test_samples_and_tokens_of_a_batch(batch, expected):
    assert batch_counts(batch) == expected


def test_a_namedtuple_is_walked_as_a_tuple():
    Pair = collections.namedtuple("Pair", "ids labels")
    assert batch_counts(Pair(ids(B, S), ids(B, S))) == (B, B * S)


def test_padding_counts_as_tokens():
    """Only shapes are read: the mask's zeros are not (reading them would wait for a device)."""
    batch = hf_batch()
    batch["attention_mask"][:, S // 2 :] = 0
    assert batch_counts(batch) == (B, B * S)


def test_a_tensor_past_the_walks_bound_is_not_looked_for():
    assert batch_counts([[] for _ in range(MAX_ITEMS)] + [ids(B, S)]) == (0, 0)
    assert batch_counts([[] for _ in range(MAX_ITEMS - 2)] + [ids(B, S)]) == (B, B * S)


def test_a_batch_that_holds_itself_or_is_deep_ends_the_walk():
    cycle: list = []
    cycle.append(cycle)
    assert counted_tensor(cycle) is None
    deep: list = [ids(B, S)]
    for _ in range(10_000):  # far deeper than the interpreter's recursion limit
        deep = [deep]
    assert counted_tensor(deep) is None  # found past the bound only: nothing, and no RecursionError


class NotIterated(list):
    def __iter__(self):
        raise AssertionError("the walk went through the whole list")


def test_a_long_batch_is_read_only_as_far_as_the_bound():
    assert batch_counts(NotIterated([f"text {n}" for n in range(100_000)] + [ids(B, S)])) == (0, 0)


class Endless(Mapping):
    """A mapping of a million values, made as they are asked for."""

    def __getitem__(self, key):
        raise KeyError(key)

    def __len__(self) -> int:
        return 1_000_000

    def __iter__(self) -> Iterator:
        return iter(range(1_000_000))

    def values(self):  # type: ignore[override]
        return (f"value {n}" for n in range(1_000_000))


def test_a_mapping_is_read_only_as_far_as_the_bound():
    assert counted_tensor(Endless()) is None


class Broken(Mapping):
    def __getitem__(self, key):
        raise RuntimeError("cannot read")

    def __len__(self) -> int:
        return 1

    def __iter__(self) -> Iterator:
        return iter(["input_ids"])


def test_a_batch_that_fails_to_be_read_raises_for_the_source_to_count():
    """The source catches it (``step_error``): the batch goes on to the loop."""
    with pytest.raises(RuntimeError):
        batch_counts(Broken())
