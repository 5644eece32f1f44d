"""FLOPs of eager and lazy training steps (the CPU, TorchNeuron's device, torch_xla's lazy tensors), counted from the
operators a batch's work runs: the first time a batch of a new shape reaches the training thread, its work (from
its fetch to the next fetch or optimizer step: forward, backward, the optimizer's step) runs under a dispatch mode
that counts each operator by ``torch.utils.flop_counter``'s formulas (``flop_registry``) from its shapes as it is
dispatched; every later batch of the same shape adds that count. Nothing is read from the device and nothing runs
that would not run: the operators run as they are called, never decomposed (``FlopCounterMode`` decomposes the
operators it has no formula for).

On torch_xla the lazy step traces the same graph as without the mode, so nothing compiles once more: the mode's
handler runs with functionalization excluded, so a tensor a factory (``arange``, ``zeros``) or a copy from the host
makes there would come back bare, and views of it would trace as ``as_strided`` instead of ``view`` (a new graph,
seen under the Hugging Face Trainer). The mode wraps such a tensor as torch_xla would have (``functional``).

Not sampled: the first training step (it compiles and warms up), and anything once ``torch.compile`` has compiled a
graph (its graphs count themselves, ``graph_flops``: a dispatch mode around compiled code would make it run
eagerly). The caller says which (``eager``). A batch of a shape not sampled yet (the first step's) counts once a
batch of its shape is; one of a shape never sampled counts nothing. At most ``MAX_SHAPES`` shapes are remembered.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

MAX_SHAPES = 256
MAX_TENSORS = 32  # of a batch's signature
MAX_DEPTH = 4


def signature(batch: object) -> tuple | None:
    """The shapes and dtypes of the tensors in ``batch`` (tuples, lists, mappings, to ``MAX_DEPTH``); None if it has
    none."""
    found: list[tuple] = []
    _walk(batch, found, 0)
    return tuple(found) or None


def _walk(value: object, found: list[tuple], depth: int) -> None:
    if len(found) >= MAX_TENSORS or depth > MAX_DEPTH:
        return
    shape = getattr(value, "shape", None)
    dtype = getattr(value, "dtype", None)
    if shape is not None and dtype is not None:
        found.append((tuple(shape), str(dtype)))
    elif isinstance(value, Mapping):
        for key in list(value)[:MAX_TENSORS]:
            _walk(value[key], found, depth + 1)
    elif isinstance(value, (list, tuple)):
        for item in value[:MAX_TENSORS]:
            _walk(item, found, depth + 1)


class SampledFlops:
    """Per batch shape, the FLOPs of a batch's work, and the total of the batches counted (``total``)."""

    def __init__(
        self,
        on_error: Callable[[BaseException], None],
        eager: Callable[[], bool],
        functional: Callable[[], str | None] = lambda: None,
    ):
        """``eager()``: whether the training steps run op by op now (not compiled by torch.compile): only then is a
        batch's work sampled. ``functional()``: the device type whose tensors are functionalized (torch_xla's
        ``xla``), or None."""
        self._on_error = on_error
        self._eager = eager
        self._functional = functional
        self._known: dict[tuple, int] = {}
        self._unsampled: dict[tuple, int] = {}  # batches of a shape not known yet: counted once it is
        self._open: tuple[Any, tuple] | None = None  # the FlopCounterMode entered, and the shape it samples
        self.total = 0
        self.stepped = 0  # optimizer steps seen
        self.broken = False  # a window could not be closed: no more sampling

    # -- the training thread ------------------------------------------------------------------------------------
    def fetching(self) -> None:
        """The training thread asks its input pipeline for the next batch: the last batch's work is done."""
        if self._open is not None:
            self._close()

    def fetched(self, batch: object) -> None:
        """The training thread got ``batch``."""
        shape = signature(batch)
        if shape is None:
            return
        flops = self._known.get(shape)
        if flops is not None:
            self.total += flops
        elif self._may_sample():
            self._sample(shape)
        elif shape in self._unsampled or len(self._unsampled) < MAX_SHAPES:
            self._unsampled[shape] = self._unsampled.get(shape, 0) + 1

    def optimizer_stepped(self) -> None:
        self.stepped += 1
        if self._open is not None:
            self._close()

    # -- sampling -----------------------------------------------------------------------------------------------
    def _may_sample(self) -> bool:
        if self._open is not None or not self.stepped or self.broken or len(self._known) >= MAX_SHAPES:
            return False
        return self._eager()

    def _sample(self, shape: tuple) -> None:
        try:
            from torch.utils._python_dispatch import _get_current_dispatch_mode

            if _get_current_dispatch_mode() is not None:
                return  # the user's own mode: a window could end inside it, out of order
            mode = _counting_mode(self._functional())
            mode.__enter__()
        except Exception as error:  # noqa: BLE001
            self.broken = True
            self._on_error(error)
            return
        self._open = (mode, shape)

    def _close(self) -> None:
        mode, shape = self._open  # type: ignore[misc]
        try:
            from torch.utils._python_dispatch import _get_current_dispatch_mode

            if _get_current_dispatch_mode() is not mode:
                return  # a mode the user entered since is above it: closed at a later chance, once it has gone
            self._open = None
            mode.__exit__(None, None, None)
            if mode.failure is not None:
                raise mode.failure
            flops = int(mode.flops)
        except Exception as error:  # noqa: BLE001
            self._open = None
            self.broken = True
            self._on_error(error)
            return
        self._known[shape] = flops
        self.total += flops * (1 + self._unsampled.pop(shape, 0))


def _counting_mode(functional: str | None = None):
    """A dispatch mode that counts the FLOPs of the operators dispatched under it, and changes nothing. On a
    ``functional`` device type, a tensor made from no tensor of that device (a factory's, a copy from the host) is
    wrapped for functionalization, as it would have been without the mode."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves, tree_map
    from torch.utils.flop_counter import flop_registry

    functionalize = torch._C.DispatchKey.Functionalize

    def on_device(value: object) -> bool:
        return isinstance(value, torch.Tensor) and value.device.type == functional

    def wrapped(value: object) -> object:
        if not isinstance(value, torch.Tensor) or value.device.type != functional:
            return value
        return value if torch._C._dispatch_keys(value).has(functionalize) else torch._to_functional_tensor(value)

    class Counting(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.flops = 0
            self.failure: BaseException | None = None

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            try:
                formula = flop_registry.get(func._overloadpacket)
                if formula is not None:
                    self.flops += formula(*args, **kwargs, out_val=out)
            except Exception as error:  # noqa: BLE001 (never into the user's operator)
                self.failure = error
            if functional is not None:
                try:
                    if not any(on_device(leaf) for leaf in tree_leaves((args, kwargs))):
                        out = tree_map(wrapped, out)  # it came through no functionalization kernel to wrap it
                except Exception as error:  # noqa: BLE001
                    self.failure = error
            return out

    return Counting()
