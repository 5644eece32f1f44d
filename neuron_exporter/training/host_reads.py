"""Wrappers on the Python paths by which device data reaches the host, and by which host data reaches the device.

A host read (``.item()``, ``if t:``, ``int(t)``, ``.tolist()``, ``.cpu()``, ``.to("cpu")``, ``.numpy()``, printing or
formatting a tensor) needs the tensor's value: on XLA the pending graph runs there (a graph cut), on an eager device
(TorchNeuron's ``neuron``) the host waits for the device. Each wrapper takes a fast path for any tensor but one of
its device (``xla``, or another device type); for one of those its owner makes the read (on XLA, reading the compile
counters around it and recording the read, its site, and whether it ran a graph and a compilation).
A read inside another (``print(t)`` calls several) counts once. Results and exceptions are the original method's.

torch_xla's partial sync of chosen tensors (``_xla_sync_multi``: ``xm.mesh_reduce``, ``xm.save``) is wrapped the
same way: it cuts the graph without a Tensor method, and its cuts are named ``sync_tensors``.

On XLA only, uploads (``Tensor.to(device)`` of a CPU tensor, ``_xla_tensors_from_aten``, and the batch a parallel
loader hands to the training thread, whose own uploads run ahead on a thread of their own) are recorded with their
shapes, to name the input whose shape changed at a recompilation.

While ``torch.compile`` (dynamo) compiles, the wrappers are taken off, so that it traces the methods as they are
and breaks its graphs exactly where it would without the exporter. ``uninstall()`` puts every method back, except one
that someone wrapped after us: theirs stays, and ours inside it does nothing (``patching``).
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable

import torch

from . import dynamo_callbacks
from .attribution import SYNC_TENSORS
from .dynamo_skip import never_traced
from .patching import Patch
from .time_phases import HOST_SYNC, TimePhases

# Tensor method -> cause, the label value of xla_host_reads_total{cause}
READS = {
    "item": "item",
    "__bool__": "bool",
    "__int__": "int",
    "__float__": "float",
    "__index__": "index",
    "tolist": "tolist",
    "numpy": "numpy",
    "cpu": "cpu",
    "__repr__": "print",
    "__format__": "print",
}
MAX_BATCH_TENSORS = 64  # tensors of a loader's batch whose shapes are recorded


class HostReadHook:
    def __init__(
        self,
        read: Callable,
        on_error: Callable[[BaseException], None],
        device: str,
        on_upload: Callable | None = None,
        phases: Callable[[], TimePhases] | None = None,
    ):
        """``read(original, cause, tensor, args, kwargs, frame)`` makes a read of data of the ``device`` (a device
        type) from ``frame``: it calls ``original(tensor, *args, **kwargs)`` once and returns its result (its exceptions
        reach the caller unchanged), and records the read around it. ``on_upload(frame, shapes)``, for a device that
        names its uploads (XLA), records one. Both run on the thread of the read or upload and raise nothing of their
        own. ``on_error`` is told why a wrapper could not go in or come out. ``phases()``: the ledger whose
        ``host_sync`` phase a read is timed in."""
        self._owner_read = read
        self._phases = phases
        self._on_upload: Callable = on_upload or _not_named
        self._on_error = on_error
        self._local = threading.local()
        self.device = device
        self.active = False
        self._methods = [
            Patch(torch.Tensor, name, functools.partial(self._wrap_read, name, cause), on_error)
            for name, cause in READS.items()
        ]
        self._methods.append(Patch(torch.Tensor, "to", self._wrap_to, on_error))
        self._bindings: list[Patch] = []
        self._listener: dynamo_callbacks.Listener | None = None

    # -- wrappers -------------------------------------------------------------------------------------------
    def _read(self, original, cause: str, tensor, args, kwargs):
        local = self._local
        if getattr(local, "depth", 0) or not self.active:
            return original(tensor, *args, **kwargs)
        local.depth = 1
        phases = self._phases() if self._phases is not None else None
        lane = phases.open(HOST_SYNC) if phases is not None else None
        try:
            return self._owner_read(original, cause, tensor, args, kwargs, sys._getframe(2))
        finally:
            if lane is not None:
                phases.close(lane)  # type: ignore[union-attr]
            local.depth = 0

    def _wrap_read(self, name: str, cause: str, original):
        hook, device = self, self.device

        def read(tensor, *args, **kwargs):
            if not tensor.is_xla:
                return original(tensor, *args, **kwargs)
            return hook._read(original, cause, tensor, args, kwargs)

        def read_device(tensor, *args, **kwargs):  # a device without a Tensor.is_<device> of its own in C
            if tensor.is_cpu or tensor.device.type != device:
                return original(tensor, *args, **kwargs)
            return hook._read(original, cause, tensor, args, kwargs)

        if device != "xla":
            read = read_device

        read.__name__, read.__qualname__, read.__doc__ = name, f"Tensor.{name}", original.__doc__
        never_traced(read)
        return read

    def _wrap_to(self, original):
        hook, device = self, self.device
        if device != "xla":

            def to_device(tensor, *args, **kwargs):
                if not tensor.is_cpu and tensor.device.type == device and _target_type(args, kwargs) == "cpu":
                    return hook._read(original, "cpu", tensor, args, kwargs)
                return original(tensor, *args, **kwargs)

            to_device.__name__, to_device.__qualname__, to_device.__doc__ = "to", "Tensor.to", original.__doc__
            never_traced(to_device)
            return to_device

        def to(tensor, *args, **kwargs):
            if tensor.is_xla:
                if _target_type(args, kwargs) == "cpu":
                    return hook._read(original, "cpu", tensor, args, kwargs)
            elif hook.active and _target_type(args, kwargs) == "xla":
                hook._on_upload(sys._getframe(1), (tuple(tensor.shape),))
            return original(tensor, *args, **kwargs)

        to.__name__, to.__qualname__, to.__doc__ = "to", "Tensor.to", original.__doc__
        never_traced(to)
        return to

    def _wrap_from_aten(self, original):
        hook = self

        def _xla_tensors_from_aten(tensors, *args, **kwargs):
            if hook.active:
                try:
                    hook._on_upload(sys._getframe(1), tuple(tuple(t.shape) for t in tensors))
                except Exception:  # noqa: BLE001 (the upload goes on whatever the bookkeeping thinks of its arguments)
                    pass
            return original(tensors, *args, **kwargs)

        never_traced(_xla_tensors_from_aten)
        return _xla_tensors_from_aten

    def _wrap_next_item(self, original):
        hook = self

        def next_item(loader, device):
            item = original(loader, device)
            if item is not None and hook.active:
                try:
                    hook._on_upload(sys._getframe(1), _batch_shapes(item))
                except Exception:  # noqa: BLE001 (the batch goes on whatever the bookkeeping thinks of it)
                    pass
            return item

        never_traced(next_item)
        return next_item

    def _wrap_sync_multi(self, original):
        hook = self

        def _xla_sync_multi(tensors, *args, **kwargs):
            return hook._read(original, SYNC_TENSORS, tensors, args, kwargs)

        never_traced(_xla_sync_multi)
        return _xla_sync_multi

    # -- life cycle -----------------------------------------------------------------------------------------
    def install(self) -> None:
        """Never raises: a wrapper that cannot go in is counted, the others go in."""
        if not self._bindings and self.device == "xla":
            import torch_xla
            from torch_xla.distributed.parallel_loader import ParallelLoader

            xlac, on_error = torch_xla._XLAC, self._on_error
            self._bindings = [
                Patch(xlac, "_xla_tensors_from_aten", self._wrap_from_aten, on_error),
                Patch(xlac, "_xla_sync_multi", self._wrap_sync_multi, on_error),
                Patch(ParallelLoader, "next_item", self._wrap_next_item, on_error),
            ]
        self.active = True
        self._put_on()
        for patch in self._bindings:
            patch.install()
        if self._listener is None:
            self._listener = dynamo_callbacks.listen(self._compile_started, self._compile_ended, self._on_error)

    def uninstall(self) -> None:
        self.active = False
        dynamo_callbacks.forget(self._listener)
        self._listener = None
        self._take_off()
        for patch in self._bindings:
            patch.undo()

    def _put_on(self) -> None:
        for patch in self._methods:
            patch.install()

    def _take_off(self) -> None:
        for patch in self._methods:
            patch.undo()

    def _compile_started(self, compilation: dynamo_callbacks.Compilation) -> None:
        self._take_off()

    def _compile_ended(self, compilation: dynamo_callbacks.Compilation) -> None:
        if not dynamo_callbacks.compiling() and self.active:
            self._put_on()


def _target_type(args, kwargs) -> str | None:
    """The device type a ``Tensor.to(...)`` call sends to, or None for a dtype-only conversion."""
    target = kwargs.get("device", args[0] if args else None)
    if isinstance(target, torch.device):
        return target.type
    if isinstance(target, str):
        return target.split(":", 1)[0]
    if isinstance(target, torch.Tensor):  # t.to(other): other's device
        return target.device.type
    return None


def _batch_shapes(item) -> tuple:
    """The shapes of the tensors in a loader's batch (lists, tuples and dicts of tensors), in order."""
    shapes: list[tuple] = []
    pending = [item]
    while pending and len(shapes) < MAX_BATCH_TENSORS:
        value = pending.pop()
        if isinstance(value, torch.Tensor):
            shapes.append(tuple(value.shape))
        elif isinstance(value, dict):
            pending.extend(reversed(list(value.values())))
        elif isinstance(value, (list, tuple)):
            pending.extend(reversed(value))
    return tuple(shapes)


def _not_named(frame, shapes) -> None:
    """The uploads of a device that does not name them (an eager one: they never explain a recompilation)."""
