"""FLOPs counted from the graphs (``graph_flops``) and from sampled eager batches (``sampled_flops``), against the
model's FLOPs from its shapes: an embedding and two linears, 6 FLOPs per token and weight (2 forward, 4 backward)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from neuron_exporter.training.throughput.graph_flops import GraphFlops  # noqa: E402
from neuron_exporter.training.throughput.sampled_flops import SampledFlops, signature  # noqa: E402

VOCAB, WIDTH, HIDDEN = 512, 64, 256
SIZES = [8, 8, 5, 8, 5, 8, 3, 8]  # batch sizes: a shorter batch now and then
SEQUENCE = 64


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Embedding(VOCAB, WIDTH),
        torch.nn.Linear(WIDTH, HIDDEN),
        torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, VOCAB),
    )


def expected(batch: int) -> int:
    return 6 * batch * SEQUENCE * (WIDTH * HIDDEN + HIDDEN * VOCAB)


@pytest.mark.compile
def test_compiled_graphs_count_every_call_static_and_dynamic_exactly(monkeypatch):
    from torch._dynamo import output_graph

    errors: list[BaseException] = []
    counts = GraphFlops(errors.append)
    monkeypatch.setattr(
        output_graph.OutputGraph,
        "call_user_compiler",
        counts.wrap(output_graph.OutputGraph.call_user_compiler),
    )
    torch._dynamo.reset()
    net = model()
    optimizer = torch.optim.AdamW(net.parameters())
    step = torch.compile(net)
    for batch in SIZES:
        step(torch.randint(0, VOCAB, (batch, SEQUENCE))).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    with torch.no_grad():  # an evaluation: forward only, in a graph of its own
        step(torch.randint(0, VOCAB, (4, SEQUENCE)))
    assert errors == []
    assert counts.compiled >= 3  # static, then dynamic in the batch, then under no_grad (dynamo may split more)
    assert counts.total() == sum(expected(batch) for batch in SIZES) + expected(4) // 3
    torch._dynamo.reset()


def test_sampled_batches_count_the_model_exactly_from_the_first_step_on():
    errors: list[BaseException] = []
    flops = SampledFlops(errors.append, eager=lambda: True)
    net = model()
    optimizer = torch.optim.AdamW(net.parameters())
    for batch in SIZES:
        flops.fetching()
        ids = torch.randint(0, VOCAB, (batch, SEQUENCE))
        flops.fetched({"input_ids": ids, "labels": ids})
        net(ids).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
        flops.optimizer_stepped()
    assert errors == []
    assert flops.total == sum(expected(batch) for batch in SIZES)


def test_gradient_accumulation_counts_each_micro_batch():
    flops = SampledFlops(lambda error: None, eager=lambda: True)
    net = model()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    for _ in range(3):
        for _ in range(4):  # four micro-batches to a step
            flops.fetching()
            ids = torch.randint(0, VOCAB, (2, SEQUENCE))
            flops.fetched(ids)
            net(ids).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
        flops.optimizer_stepped()
    assert flops.total == 12 * expected(2)


def test_nothing_is_sampled_when_the_steps_are_not_eager_and_a_batch_without_tensors_has_no_shape():
    flops = SampledFlops(lambda error: None, eager=lambda: False)
    flops.optimizer_stepped()
    flops.fetched(torch.ones(2, 3))
    assert flops._open is None and flops.total == 0
    assert signature(["text", 3]) is None
    assert signature({"a": torch.ones(2, 3, dtype=torch.int64)}) == (((2, 3), "torch.int64"),)
    deep: list = [torch.ones(1)]
    for _ in range(100):
        deep = [deep]
    assert signature(deep) is None  # deeper than a batch is: not walked


def test_a_window_is_never_closed_out_of_order_under_a_mode_the_user_entered_in_it():
    from torch.utils._python_dispatch import TorchDispatchMode

    class Users(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    errors: list[BaseException] = []
    flops = SampledFlops(errors.append, eager=lambda: True)
    flops.optimizer_stepped()
    flops.fetched(torch.ones(2, 3))  # a window opens
    other = Users()
    other.__enter__()  # the user's mode, entered inside it and still open at the next fetch
    try:
        flops.fetching()
        assert flops._open is not None  # left open: closing it now would pop the user's mode
        flops.fetched(torch.ones(4, 3))  # and no other opens meanwhile
    finally:
        other.__exit__(None, None, None)
    flops.fetching()
    assert flops._open is None and not flops.broken and errors == []
    with Users():  # a batch fetched inside the user's mode is not sampled
        flops.fetched(torch.ones(5, 3))
        assert flops._open is None


def test_on_torch_xla_the_mode_traces_the_same_graph_as_without_it():
    """The handler runs with functionalization excluded: a tensor a factory makes there comes back bare, and its
    views would trace as ``as_strided`` (a new graph) unless the mode wraps it, as the Hugging Face Trainer's
    ``arange(...).unsqueeze(0)`` showed."""
    torch_xla = pytest.importorskip("torch_xla")
    import re

    from neuron_exporter.training.throughput.sampled_flops import _counting_mode

    device = torch_xla.device()
    weight = torch.ones(32, 8, device=device, requires_grad=True)

    def step() -> torch.Tensor:
        positions = (torch.arange(32, device=device) + 0).unsqueeze(0)[..., None].float()
        scales = torch.tensor([2.0]).to(device)[None, :]  # a copy from the host, viewed
        return (positions * scales * weight[None, :, :]).sum(-1) @ weight

    def operators(tensor: torch.Tensor) -> list[str]:
        return re.findall(r"(?:aten|xla)::\w+", torch_xla._XLAC._get_xla_tensors_text([tensor]))

    plain = operators(step())
    mode = _counting_mode("xla")
    with mode:
        counted = step()
    assert "aten::as_strided" not in plain and operators(counted) == plain
    assert mode.failure is None and mode.flops == 2 * 32 * 8  # (1, 32) @ (32, 8)
    bare = _counting_mode(None)
    with bare:  # what the wrapping avoids
        assert operators(step()) != plain
