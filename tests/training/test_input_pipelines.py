"""The input pipelines' entry points (``input_pipelines``), wrapped once for every source that listens: each listener
of a kind sees a real DataLoader's batches go by, in and out in nested order, and the last one out puts the
originals back."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader
from torch.utils.data.dataloader import _BaseDataLoaderIter

from neuron_exporter.training.input_pipelines import BATCH, NO_BATCH, PIPELINES, START
from neuron_exporter.training.patching import MARK

NEXT = _BaseDataLoaderIter.__dict__["__next__"]
ITER = DataLoader.__dict__["__iter__"]


class Recorder:
    def __init__(self, name: str, calls: list):
        self.name = name
        self.calls = calls
        self.errors: list[BaseException] = []

    def entered(self) -> str:
        self.calls.append((self.name, "in"))
        return self.name + "-token"

    def left(self, token: str, batch: object) -> None:
        assert token == self.name + "-token"
        self.calls.append((self.name, "out", None if batch is NO_BATCH else int(batch.shape[0])))


@pytest.fixture
def listeners():
    added: list[Recorder] = []
    yield added
    for listener in added:
        PIPELINES.remove(listener)
    assert _BaseDataLoaderIter.__dict__["__next__"] is NEXT and DataLoader.__dict__["__iter__"] is ITER


def listen(added: list, listener: Recorder, kinds: tuple[str, ...]) -> Recorder:
    PIPELINES.add(listener, kinds, listener.errors.append)
    added.append(listener)
    return listener


def test_every_listener_sees_each_batch_in_nested_order_and_the_end(listeners):
    calls: list = []
    listen(listeners, Recorder("phases", calls), (BATCH, START))
    listen(listeners, Recorder("throughput", calls), (BATCH,))
    batches = [batch.shape[0] for batch in DataLoader(torch.arange(5), batch_size=2)]
    assert batches == [2, 2, 1]
    assert calls[:2] == [("phases", "in"), ("phases", "out", None)]  # iter(): a start, for its listeners only
    per_batch = [
        [("phases", "in"), ("throughput", "in"), ("throughput", "out", rows), ("phases", "out", rows)]
        for rows in (2, 2, 1, None)  # the last next() raises StopIteration: no batch
    ]
    assert calls[2:] == [call for calls_of_one in per_batch for call in calls_of_one]
    assert not listeners[0].errors and not listeners[1].errors


def test_one_wrapper_for_all_and_the_originals_back_when_the_last_leaves(listeners):
    calls: list = []
    first = listen(listeners, Recorder("first", calls), (BATCH, START))
    wrapper = _BaseDataLoaderIter.__dict__["__next__"]
    assert getattr(wrapper, MARK) is NEXT
    listen(listeners, Recorder("second", calls), (BATCH,))
    assert _BaseDataLoaderIter.__dict__["__next__"] is wrapper  # not wrapped again
    PIPELINES.remove(first)
    listeners.remove(first)
    assert _BaseDataLoaderIter.__dict__["__next__"] is wrapper  # the second still listens
    list(DataLoader(torch.arange(2), batch_size=2))
    assert [name for name, *_ in calls] == ["second", "second", "second", "second"]
    PIPELINES.remove(listeners.pop())
    assert _BaseDataLoaderIter.__dict__["__next__"] is NEXT and DataLoader.__dict__["__iter__"] is ITER
    listen(listeners, Recorder("again", calls), (BATCH,))  # and wrapped again for the next one
    assert getattr(_BaseDataLoaderIter.__dict__["__next__"], MARK) is NEXT


def test_a_listener_added_twice_is_called_once(listeners):
    calls: list = []
    recorder = listen(listeners, Recorder("once", calls), (BATCH,))
    PIPELINES.add(recorder, (BATCH,), recorder.errors.append)
    next(iter(DataLoader(torch.arange(3), batch_size=3)))
    assert calls == [("once", "in"), ("once", "out", 3)]
