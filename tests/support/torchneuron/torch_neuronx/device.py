"""The ``neuron`` device, emulated on the CPU: PyTorch's PrivateUse1 key named ``neuron`` (``torch.neuron``,
``Tensor.neuron()``, ``torch.device("neuron")``), tensors that hold a CPU tensor, and one Python kernel that runs
every operator on that CPU tensor.

What TorchNeuron does per operator, this does too (torch-neuronx's README and ``csrc``):
- an operator with a Neuron kernel runs "on the device": here on the CPU, through the compilation cache (one NEFF
  per operator and shapes, compiled at the first call), and added to the executed set;
- path a, an operator with no kernel (``UNIMPLEMENTED``): the C++ boxed fallback runs it on the CPU and adds its name
  to the fallback set, with no Python call (a structured op arrives as its ``.out`` overload, as on the device);
- path b, an operator TorchNeuron registers from Python whose implementation cannot take the call (``OFFLOADED``):
  it syncs the stream, copies its tensors to the host from Python (``Tensor.to("cpu")``), runs on the CPU and calls
  ``torch_neuronx._C._log_offloaded_op(name)``, looked up at each call;
- a copy to the host (``.item()``, ``.cpu()``) waits for the stream (a synchronization), unless ``non_blocking``.

The recipe (measured on torch 2.14.1): ``_setup_privateuseone_for_python_backend``; tensors made by
``torch._C._acc.create_empty_tensor`` as ``NeuronTensor``; ``detach`` and ``alias`` as the device's own kernels
(the composite ones would lose the data); ``FakeTensor.__new__`` run with PrivateUse1 excluded, and ``NeuronTensor``
among the types aot_autograd handles, for ``torch.compile``.
"""

from __future__ import annotations

import weakref

import torch
import torch._dynamo  # before the device exists: dynamo's import checks the registered backends
from torch.library import Library
from torch.utils import _pytree as pytree
from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

from . import _C

UNIMPLEMENTED = {"aten::lgamma"}  # path a: no Neuron kernel
OFFLOADED = {"aten::digamma"}  # path b: a Python-registered op whose implementation cannot take these calls
HOST_READS = {"aten::_local_scalar_dense"}  # device-to-host copies, besides _to_copy/copy_ to the CPU
EAGER_COMPILE_US = 2_000.0  # what the emulated neuronx-cc takes for an operator's NEFF
graphs_running = 0  # a compiled graph's NEFF is running: its operators are not compiled one by one

CPU = torch.device("cpu")


class NeuronTensor(torch.Tensor):
    """A tensor on the ``neuron`` device whose data is ``raw``, a CPU tensor. Torch functions are disabled (else
    dynamo breaks its graphs at it); formatting a scalar reads it, as ``Tensor.__format__`` does for a plain tensor
    (a plain tensor could not be used: every tensor the kernels return would have a Python object already, which
    ``nn.Parameter`` refuses)."""

    __torch_function__ = torch._C._disabled_torch_function_impl

    @staticmethod
    def __new__(cls, raw: torch.Tensor):
        tensor = torch._C._acc.create_empty_tensor(tuple(raw.shape), raw.dtype)
        tensor.__class__ = cls
        return tensor

    def __init__(self, raw: torch.Tensor):
        self.raw = raw

    @property
    def raw(self) -> torch.Tensor:
        return self.untyped_storage()._neuron_raw

    @raw.setter
    def raw(self, raw: torch.Tensor) -> None:
        # On the storage, whose Python object PyTorch keeps with it: the tensors autograd makes of this one in C++
        # (a saved tensor, unpacked) share it, and find the data there.
        self.untyped_storage()._neuron_raw = raw

    def __coerce_same_metadata_as_tangent__(self, expected_meta, expected_type=None):
        return self  # a gradient on the device, where aot_autograd traced a plain tensor: the same to the graph

    def __format__(self, spec):
        if self.dim() == 0:
            return self.detach().item().__format__(spec)
        return object.__format__(self, spec)


def neuron_tensor(raw: torch.Tensor) -> NeuronTensor:
    return NeuronTensor(raw)


def raw_of(value) -> torch.Tensor | None:
    if isinstance(value, NeuronTensor):
        return value.raw
    if isinstance(value, torch.Tensor) and not value.is_cpu and value.device.type == "neuron":
        return getattr(value.untyped_storage(), "_neuron_raw", None)  # made of a device tensor in C++
    return None


class BackendModule:
    """``torch.neuron``."""

    def is_initialized(self) -> bool:
        return True

    def is_available(self) -> bool:
        return True

    def current_device(self) -> int:
        return 0

    def device_count(self) -> int:
        return 1

    def _is_in_bad_fork(self) -> bool:
        return False

    def manual_seed_all(self, seed: int) -> None:
        pass  # the device's random numbers are the CPU's, which torch.manual_seed seeds

    def synchronize(self, device=None) -> None:
        _C._synchronize()

    def memory_stats(self, device=None) -> dict:
        """Flattened like ``torch.cuda.memory_stats``: ``active_bytes.peak``, ``num_ooms``..."""
        stats = {}
        for key, value in _C._get_memory_stats(0).items():
            if isinstance(value, dict):
                stats.update({f"{key}.{part}": number for part, number in value.items()})
            else:
                stats[key] = value
        return stats

    def memory_allocated(self, device=None) -> int:
        return _C._get_memory_stats(0)["allocated_bytes"]["current"]

    def get_dynamo_metrics(self):
        import torch_neuronx

        return torch_neuronx.get_dynamo_metrics()


def _name(op) -> str:
    schema = op._schema
    return schema.name + (f".{schema.overload_name}" if schema.overload_name else "")


def _raw(value):
    raw = raw_of(value)
    if raw is not None:
        return raw
    if isinstance(value, torch.device) and value.type == "neuron":
        return CPU
    if isinstance(value, str) and value.split(":")[0] == "neuron":
        return "cpu"
    return value


def _track(tensor: NeuronTensor) -> NeuronTensor:
    raw = tensor.raw
    if raw._base is None:  # a new buffer, not a view of one
        nbytes = raw.untyped_storage().nbytes()
        _C.allocated(nbytes)
        weakref.finalize(tensor, _C.freed, nbytes)
    return tensor


def _run_on_cpu(op, args, kwargs):
    """The operator on the CPU tensors; its results back on the device (an in-place result is its input)."""
    inputs = {id(raw_of(t)): t for t in pytree.tree_leaves((args, kwargs)) if raw_of(t) is not None}
    to_device = op in (torch.ops.aten._to_copy.default,) and _target(kwargs) == "neuron"
    to_host = op is torch.ops.aten._to_copy.default and not to_device and inputs
    raw_args, raw_kwargs = pytree.tree_map(_raw, (args, kwargs))
    if op is torch.ops.aten.as_strided.default and not raw_args[0].is_contiguous():
        # The device's tensors claim a contiguous layout (create_empty_tensor takes no strides): strides given for
        # it apply to a contiguous copy of the data (an expanded gradient, a transposed view).
        raw_args = (raw_args[0].contiguous(), *raw_args[1:])
    if to_host:
        if not raw_kwargs.get("non_blocking"):
            _C._synchronize()
        return op(*raw_args, **raw_kwargs)
    if op is torch.ops.aten._copy_from.default:  # (src, dst): dst's data becomes src's
        src, dst = args[0], args[1]
        if raw_of(src) is not None and raw_of(dst) is None:
            _C._synchronize()
        raw_args[1].copy_(raw_args[0])
        return dst
    result = op(*raw_args, **raw_kwargs)

    def back(value):
        if isinstance(value, torch.Tensor) and raw_of(value) is None:
            same = inputs.get(id(value))
            if same is None:
                return _track(neuron_tensor(value))
            if same.shape != value.shape:  # an out= tensor the CPU kernel resized: its metadata follows
                same.data = neuron_tensor(value)
                same.raw = value
            return same
        return value

    return pytree.tree_map(back, result)


def _target(kwargs) -> str | None:
    device = kwargs.get("device")
    return torch.device(device).type if device is not None else None


def kernel(op, *args, **kwargs):
    """Every operator on the device reaches this one function (PyTorch's boxed fallback for PrivateUse1)."""
    name = op._schema.name
    if name in UNIMPLEMENTED:
        _C._track_fallback(_name(op))  # a structured op arrives as its .out overload: aten::lgamma.out
        return _run_on_cpu(op, args, kwargs)
    if name in OFFLOADED:
        _C._synchronize()
        cpu_args, cpu_kwargs = _move_pytree_to_cpu((args, kwargs))
        result = op(*cpu_args, **cpu_kwargs)
        _offload(name)
        return pytree.tree_map(lambda v: _track(neuron_tensor(v)) if isinstance(v, torch.Tensor) else v, result)
    if name in HOST_READS:
        _C._synchronize()
        return _run_on_cpu(op, args, kwargs)
    if not graphs_running and not op.is_view and name not in _NO_KERNEL:
        _eager_compile(op, args)
    return _run_on_cpu(op, args, kwargs)


# Operators that only make or move tensors: no NEFF of their own.
_NO_KERNEL = {
    "aten::empty",
    "aten::empty_strided",
    "aten::_to_copy",
    "aten::_copy_from",
    "aten::_copy_from_and_resize",
    "aten::copy_",
    "aten::detach",
    "aten::alias",
    "aten::set_",
    "aten::resize_",
}


def _move_pytree_to_cpu(tree):
    """What path b does first, from Python (``utils.move_pytree_to_cpu``): each device tensor copied with ``.to``."""
    return pytree.tree_map(lambda value: value.to("cpu") if raw_of(value) is not None else value, tree)


def _offload(name: str) -> None:
    import torch_neuronx

    torch_neuronx._C._log_offloaded_op(name)  # looked up at each call, as Operation.__call__ does


def _eager_compile(op, args) -> None:
    shapes = tuple(tuple(a.shape) for a in args if isinstance(a, torch.Tensor))
    key = f"{_name(op)}{shapes}"
    if key not in _C.cache_keys:
        _C.compile_through_cache(key, EAGER_COMPILE_US)
    else:
        _C.cache["in_memory_hits"] += 1
    _C._log_executed_op(_name(op))


def _fake_tensor_without_the_device_key() -> None:
    """FakeTensor.__new__ makes a tensor of the fake device: with PrivateUse1 excluded it does not reach the
    emulated kernels (a real backend's C++ device needs none of this)."""
    import torch._functorch._aot_autograd.runtime_wrappers as runtime_wrappers
    import torch.fx.experimental.proxy_tensor as proxy_tensor
    from torch._subclasses.fake_tensor import FakeTensor

    new = FakeTensor.__new__

    def __new__(cls, *args, **kwargs):
        with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(torch._C.DispatchKey.PrivateUse1)):
            return new(cls, *args, **kwargs)

    FakeTensor.__new__ = staticmethod(__new__)  # type: ignore[method-assign]
    for module in (proxy_tensor, runtime_wrappers):
        if NeuronTensor not in module.HANDLED_TYPES:
            module.HANDLED_TYPES = (*module.HANDLED_TYPES, NeuronTensor)


_library = None
_aten = None


def register() -> None:
    global _library
    if _library is not None:
        return
    _setup_privateuseone_for_python_backend("neuron", backend_module=BackendModule())
    _library = Library("_", "IMPL")
    _library.fallback(kernel, "PrivateUse1")
    # Composite kernels would make these views as plain tensors, without the data: the device's own, as in C++.
    global _aten
    _aten = Library("aten", "IMPL")
    for name in ("detach", "alias"):
        op = getattr(torch.ops.aten, name).default
        _aten.impl(name, lambda *args, op=op, **kwargs: kernel(op, *args, **kwargs), "PrivateUse1")
    _fake_tensor_without_the_device_key()
