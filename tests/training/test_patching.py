"""``Patch``, the one way the exporter wraps someone else's attribute: once, undone only while still ours, across
forks and threads, and never raising into its caller."""

from __future__ import annotations

import json
import os
import sys
import threading
import time

import pytest

from neuron_exporter.training.patching import MARK, Patch


class Base:
    def inherited(self):
        return "inherited"


class Owner(Base):
    def method(self):
        return "original"


ORIGINAL = Owner.__dict__["method"]


@pytest.fixture(autouse=True)
def clean_owner():
    yield
    Owner.method = ORIGINAL  # type: ignore[method-assign]
    for name in ("inherited", *[f"method_{i}" for i in range(8)]):
        if name in Owner.__dict__:
            delattr(Owner, name)


class Calls:
    """A wrap function that counts the wrappers it made and the calls through them, and the errors reported."""

    def __init__(self):
        self.wrapped = 0
        self.calls = 0
        self.errors: list[BaseException] = []

    def wrap(self, original):
        self.wrapped += 1

        def wrapper(*args, **kwargs):
            self.calls += 1
            return original(*args, **kwargs)

        return wrapper

    def patch(self, name: str = "method", owner=Owner) -> Patch:
        return Patch(owner, name, self.wrap, self.errors.append)


def test_a_second_install_is_a_no_op():
    calls = Calls()
    patch = calls.patch()
    assert patch.install() and patch.install()
    assert calls.wrapped == 1 and Owner.__dict__["method"] is patch.wrapper
    assert Owner().method() == "original" and calls.calls == 1
    assert getattr(patch.wrapper, MARK) is ORIGINAL and not calls.errors


def test_undo_restores_the_original_while_the_attribute_is_still_ours():
    calls = Calls()
    patch = calls.patch()
    patch.install()
    assert patch.undo() and not patch.installed
    assert Owner.__dict__["method"] is ORIGINAL and not calls.errors


def test_undo_deletes_an_attribute_the_owner_inherited():
    calls = Calls()
    patch = calls.patch("inherited")
    patch.install()
    assert "inherited" in Owner.__dict__ and Owner().inherited() == "inherited" and calls.calls == 1
    assert patch.undo()
    assert "inherited" not in Owner.__dict__ and Owner.inherited is Base.inherited


def test_undo_twice_is_a_no_op():
    calls = Calls()
    patch = calls.patch()
    patch.install()
    assert patch.undo() and patch.undo()
    assert Owner.__dict__["method"] is ORIGINAL and not calls.errors


def test_someone_who_wrapped_after_us_keeps_their_wrapper():
    calls = Calls()
    patch = calls.patch()
    patch.install()
    ours = Owner.method

    def theirs(self):
        return "theirs:" + ours(self)

    Owner.method = theirs  # type: ignore[method-assign]
    assert not patch.undo()  # theirs stays, with ours inside it
    assert Owner.__dict__["method"] is theirs and Owner().method() == "theirs:original"
    assert patch.installed and patch.install() and calls.wrapped == 1  # not wrapped twice
    Owner.method = ours  # type: ignore[method-assign]  # they take theirs off: ours can be undone at last
    assert patch.undo() and Owner.__dict__["method"] is ORIGINAL and not calls.errors


def test_an_attribute_another_patch_holds_is_not_wrapped_again():
    first, second = Calls(), Calls()
    assert first.patch().install()
    late = second.patch()
    assert not late.install() and not late.installed
    assert second.wrapped == 0 and "already wrapped" in str(second.errors[0])
    assert Owner().method() == "original" and first.calls == 1


class Failing:
    """An owner whose attribute cannot be read, written or deleted."""

    def __init__(self):
        self.__dict__["item"] = len

    def __getattribute__(self, name):
        if name == "broken":
            raise RuntimeError("cannot read")
        return object.__getattribute__(self, name)

    def __setattr__(self, name, value):
        raise RuntimeError("cannot write")

    def __delattr__(self, name):
        raise RuntimeError("cannot delete")


def raising(error: BaseException):
    raise RuntimeError("the reporter fails too")


@pytest.mark.parametrize(
    "patch",
    [
        pytest.param(lambda calls: calls.patch("no_such_attribute"), id="missing"),
        pytest.param(lambda calls: calls.patch("broken", Failing()), id="unreadable"),
        pytest.param(lambda calls: calls.patch("item", Failing()), id="unwritable"),
        pytest.param(lambda calls: calls.patch("real", int), id="builtin type"),
        pytest.param(lambda calls: Patch(Owner, "method", raising, calls.errors.append), id="wrap raises"),
        pytest.param(lambda calls: Patch(Owner, "no_such_attribute", calls.wrap, raising), id="reporter raises"),
    ],
)
def test_an_error_inside_the_primitive_never_escapes(patch):
    calls = Calls()
    made = patch(calls)
    assert made.install() is False and not made.installed
    assert made.undo() is True  # nothing to undo
    assert Owner.__dict__["method"] is ORIGINAL
    assert len(calls.errors) == (0 if made._on_error is raising else 1)


class Freezable(type):
    """A class that refuses to change while frozen."""

    frozen = False

    def __setattr__(cls, name, value):
        if Freezable.frozen:
            raise RuntimeError("cannot write")
        super().__setattr__(name, value)


def test_an_undo_that_fails_is_reported_and_can_be_tried_again():
    calls = Calls()
    owner = Freezable("Owned", (), {"method": ORIGINAL})
    patch = calls.patch(owner=owner)
    patch.install()
    Freezable.frozen = True
    try:
        assert patch.undo() is False and patch.installed
    finally:
        Freezable.frozen = False
    assert "cannot write" in str(calls.errors[0])
    assert patch.undo() and owner.__dict__["method"] is ORIGINAL


def forked(child) -> dict:
    """Fork; in the child run ``child()`` and send its result back through a pipe."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            result = child()
        except BaseException as error:  # noqa: BLE001
            result = {"error": repr(error)}
        os.write(write, json.dumps(result).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        found = pipe.read()
    assert os.waitpid(pid, 0)[1] == 0
    return json.loads(found)


def test_a_forked_child_neither_patches_twice_nor_loses_the_undo():
    calls = Calls()
    patch = calls.patch()
    patch.install()
    wrapper = patch.wrapper

    def child():
        installed_again = patch.install()
        return {
            "installed": installed_again and patch.installed,
            "same_wrapper": Owner.__dict__["method"] is wrapper,
            "wrapped": calls.wrapped,
            "undone": patch.undo() and Owner.__dict__["method"] is ORIGINAL,
            "errors": [repr(error) for error in calls.errors],
        }

    assert forked(child) == {"installed": True, "same_wrapper": True, "wrapped": 1, "undone": True, "errors": []}
    assert Owner.__dict__["method"] is wrapper and patch.installed  # the parent's own is untouched


def test_a_fork_waits_for_a_patch_being_made_and_the_child_gets_a_free_lock():
    calls = Calls()
    started = threading.Event()

    def slow_wrap(original):
        started.set()
        time.sleep(0.3)  # the fork comes now, while the patch is half made
        return calls.wrap(original)

    patch = Patch(Owner, "method", slow_wrap, calls.errors.append)
    installer = threading.Thread(target=patch.install)
    installer.start()
    assert started.wait(10)

    def child():
        found = {
            "complete": patch.installed and Owner.__dict__["method"] is patch.wrapper,
            "undone": patch.undo() and Owner.__dict__["method"] is ORIGINAL,
        }
        # No thread of the child holds the lock: neither the installer, which the child does not have, nor the
        # thread that forked.
        other = Calls().patch("inherited")
        thread = threading.Thread(target=lambda: found.update(other=other.install() and other.undo()))
        thread.start()
        thread.join(5)
        return found

    assert forked(child) == {"complete": True, "undone": True, "other": True}
    installer.join()
    assert patch.installed and not calls.errors


def test_many_threads_installing_and_undoing_leave_one_consistent_wrapper():
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        calls = Calls()
        shared = calls.patch()
        own = [Calls() for _ in range(4)]
        owned = [c.patch(f"method_{i}") for i, c in enumerate(own)]
        for i in range(len(owned)):
            setattr(Owner, f"method_{i}", ORIGINAL)
        barrier = threading.Barrier(8)
        wrong: list[str] = []

        def work(index: int) -> None:
            barrier.wait()
            mine = owned[index % len(owned)]
            for _ in range(300):
                shared.install()
                if Owner().method() != "original":
                    wrong.append(Owner().method())
                mine.install()
                shared.undo()
                mine.undo()

        threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for patch in [shared, *owned]:
            current = Owner.__dict__[patch.name]
            assert (current is patch.wrapper) if patch.installed else (current is ORIGINAL)
            assert getattr(current, MARK, ORIGINAL) is ORIGINAL  # never a wrapper of a wrapper
            patch.undo()
            assert Owner.__dict__[patch.name] is ORIGINAL
        assert not wrong and not calls.errors and not any(c.errors for c in own)
    finally:
        sys.setswitchinterval(interval)


def test_concurrent_installs_wrap_once():
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        calls = Calls()
        patch = calls.patch()
        barrier = threading.Barrier(16)

        def install():
            barrier.wait()
            patch.install()

        threads = [threading.Thread(target=install) for _ in range(16)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert calls.wrapped == 1 and Owner.__dict__["method"] is patch.wrapper
    finally:
        sys.setswitchinterval(interval)


def test_the_optimizer_hook_leaves_a_later_wrapper_in_place_and_does_nothing_inside_it():
    torch = pytest.importorskip("torch")
    from torch.optim.optimizer import Optimizer

    from neuron_exporter.training.steps.optimizer_hook import OptimizerHook

    created: list[int] = []
    errors: list[BaseException] = []
    hook = OptimizerHook(lambda: created.append(1), lambda *args: None, errors.append)
    original = Optimizer.__dict__["_patch_step_function"]
    hook.install()
    ours = Optimizer.__dict__["_patch_step_function"]

    def theirs(optimizer, *args, **kwargs):
        return ours(optimizer, *args, **kwargs)

    Optimizer._patch_step_function = theirs  # type: ignore[method-assign]
    try:
        torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
        assert created == [1]
        hook.uninstall()
        assert Optimizer.__dict__["_patch_step_function"] is theirs
        torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
        assert created == [1]
    finally:
        Optimizer._patch_step_function = original  # type: ignore[method-assign]
    assert not errors
