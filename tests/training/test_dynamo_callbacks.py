"""dynamo's compilations fanned out: every thread's own compilation is told on that thread, once however many
listen, and after ``torch._dynamo.reset()`` too (real torch.compile, the eager backend)."""

from __future__ import annotations

import sys
import threading

import pytest

torch = pytest.importorskip("torch")

from neuron_exporter.training import dynamo_callbacks  # noqa: E402

if dynamo_callbacks.problem() is not None:
    pytest.skip(dynamo_callbacks.problem(), allow_module_level=True)


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, int, str]] = []
        self.lock = threading.Lock()

    def started(self, compilation: dynamo_callbacks.Compilation) -> None:
        with self.lock:
            self.events.append(("start", compilation.thread, compilation.trigger))

    def ended(self, compilation: dynamo_callbacks.Compilation) -> None:
        with self.lock:
            self.events.append(("end", compilation.thread, compilation.trigger))


@pytest.fixture
def recorder():
    recorder = Recorder()
    listener = dynamo_callbacks.listen(recorder.started, recorder.ended, pytest.fail)
    assert listener is not None
    yield recorder
    dynamo_callbacks.forget(listener)


def test_each_compilation_is_told_after_a_reset_without_registering_again(recorder):
    torch._dynamo.reset()
    torch.compile(lambda x: x * 2 + 1, backend="eager")(torch.ones(2))
    me = threading.get_ident()
    assert recorder.events == [("start", me, "DYNAMO"), ("end", me, "DYNAMO")]


def test_two_listeners_wrap_the_bracket_once_and_the_last_one_gone_unwraps_it(recorder):
    from torch._dynamo.callback import callback_handler

    other = Recorder()
    listener = dynamo_callbacks.listen(other.started, other.ended, pytest.fail)
    assert "install_callbacks" in vars(callback_handler)  # the wrapper stands on the handler object
    torch._dynamo.reset()
    torch.compile(lambda x: x - 1, backend="eager")(torch.ones(2))
    assert len(recorder.events) == len(other.events) == 2
    dynamo_callbacks.forget(listener)
    assert "install_callbacks" in vars(callback_handler)  # the recorder still listens
    torch._dynamo.reset()
    torch.compile(lambda x: x - 2, backend="eager")(torch.ones(2))
    assert len(recorder.events) == 4 and len(other.events) == 2


def test_the_bracket_is_unwrapped_when_nobody_listens():
    from torch._dynamo.callback import callback_handler

    recorder = Recorder()
    listener = dynamo_callbacks.listen(recorder.started, recorder.ended, pytest.fail)
    dynamo_callbacks.forget(listener)
    assert "install_callbacks" not in vars(callback_handler)
    torch._dynamo.reset()
    torch.compile(lambda x: x + 3, backend="eager")(torch.ones(2))
    assert recorder.events == []


def test_threads_that_compile_at_the_same_time_are_each_told_on_their_own_thread(recorder):
    """dynamo's own callbacks run only for the first start and the last end of all threads: a thread that compiles
    while another does is never told there, and an end can come on another thread than its start."""
    torch._dynamo.reset()
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []

    def train(offset: int) -> None:
        try:
            barrier.wait()
            for step in range(6):
                torch.compile(lambda x, step=step: x * offset + step, backend="eager", dynamic=False)(
                    torch.ones(2 + step)
                )
        except BaseException as error:  # noqa: BLE001
            errors.append(error)

    threads = [threading.Thread(target=train, args=(offset,)) for offset in range(4)]
    limit = torch._dynamo.config.patch(recompile_limit=1000, accumulated_recompile_limit=1000)
    limit.__enter__()
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(switch)
        limit.__exit__(None, None, None)
    assert not errors
    for thread in threads:
        mine = [event for event, ident, _ in recorder.events if ident == thread.ident]
        assert mine == ["start", "end"] * (len(mine) // 2) and len(mine) >= 12, mine
    assert not dynamo_callbacks.compiling()
