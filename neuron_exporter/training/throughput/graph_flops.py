"""FLOPs of what ``torch.compile`` compiled, counted from its graphs: each graph dynamo hands its backend
(``OutputGraph.call_user_compiler``, one per piece between graph breaks) is counted once, when it is compiled, by
running it on fake tensors (shapes only, no data, no device) under ``torch.utils.flop_counter.FlopCounterMode``,
forward and, when an output requires a gradient, backward; then every call of the compiled graph adds its FLOPs.
A graph compiled for dynamic shapes has FLOPs that depend on its inputs' sizes: the count is an expression of
dynamo's size symbols, evaluated at each call for the sizes it gets (once per distinct sizes).

The counting runs inside the compilation (tens of milliseconds a graph, in its ``compile`` time), with the shape
environment's guards suppressed: it adds no guard, so no recompilation. A call costs one Python call more, and for a
dynamic graph a lookup of its sizes. A graph that cannot be counted (an operator fake tensors cannot run) counts 0,
once counted as the exporter's own failure.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any

from ..dynamo_skip import never_traced

MAX_SIZES = 64  # distinct input sizes remembered per dynamic graph


class GraphFlops:
    """The FLOPs of the compiled graphs' calls so far (``total``)."""

    def __init__(self, on_error: Callable[[BaseException], None]):
        self._on_error = on_error
        self._lock = threading.Lock()
        self._done = 0  # FLOPs of the calls of graphs that no longer count themselves
        self._graphs: list[_Counted] = []
        self.compiled = 0  # graphs counted

    def total(self) -> int:
        with self._lock:
            graphs = list(self._graphs)
        return self._done + sum(graph.flops for graph in graphs)

    def wrap(self, original: Callable) -> Callable:
        """``OutputGraph.call_user_compiler``, returning the backend's compiled graph inside a counter of its calls."""
        counts = self

        def call_user_compiler(self, gm, example_inputs, *args, **kwargs):
            compiled = original(self, gm, example_inputs, *args, **kwargs)
            try:
                counted = _Counted(compiled, *flops_of(gm, example_inputs))
            except Exception as error:  # noqa: BLE001 (the compilation goes on, uncounted)
                counts._on_error(error)
                return compiled
            with counts._lock:
                counts._graphs.append(counted)
                counts.compiled += 1
            return counted.call

        call_user_compiler.__wrapped__ = original  # type: ignore[attr-defined]
        return call_user_compiler


class _Counted:
    """One compiled graph and the FLOPs of its calls."""

    def __init__(self, compiled: Callable, flops: Any, bindings: list[tuple[Any, int, int | None]]):
        self.flops = 0
        self._compiled = compiled
        self._static = None if bindings else int(flops)
        self._expression = flops
        self._bindings = bindings  # (symbol, input position, dimension or None for an integer input)
        self._by_sizes: dict[tuple, int] = {}
        counted = self

        def call(*args, **kwargs):
            static = counted._static
            if static is not None:
                counted.flops += static
            else:
                counted.flops += counted._dynamic(args)
            return counted._compiled(*args, **kwargs)

        never_traced(call)
        self.call = call

    def _dynamic(self, args: tuple) -> int:
        try:
            sizes = tuple(
                int(args[position]) if dimension is None else args[position].shape[dimension]
                for _, position, dimension in self._bindings
            )
        except (IndexError, AttributeError, TypeError, ValueError):
            return 0
        flops = self._by_sizes.get(sizes)
        if flops is None:
            values = {symbol: size for (symbol, _, _), size in zip(self._bindings, sizes, strict=True)}
            flops = int(self._expression.xreplace(values))
            if len(self._by_sizes) < MAX_SIZES:
                self._by_sizes[sizes] = flops
        return flops


def flops_of(gm, example_inputs: list) -> tuple[Any, list[tuple[Any, int, int | None]]]:
    """The FLOPs of a dynamo graph, forward and backward, run on fake tensors; with dynamic shapes, a sympy expression
    of the size symbols and where each symbol is found among the graph's inputs."""
    import torch
    from torch.utils._pytree import tree_leaves
    from torch.utils.flop_counter import FlopCounterMode

    context = torch._guards.TracingContext.try_get()
    fake_mode = context.fake_mode if context is not None else None
    if fake_mode is None:
        raise RuntimeError("no fake tensor mode to count a compiled graph's FLOPs in")
    inputs = [fake_mode.from_tensor(x) if isinstance(x, torch.Tensor) else x for x in example_inputs]
    shape_env = getattr(fake_mode, "shape_env", None)
    quiet = shape_env.suppress_guards() if shape_env is not None else contextlib.nullcontext()
    with quiet, fake_mode, FlopCounterMode(display=False) as counter:
        outputs = gm(*inputs)
        needing = [o for o in tree_leaves(outputs) if isinstance(o, torch.Tensor) and o.requires_grad]
        if needing:
            torch.autograd.backward(needing, [torch.ones_like(o) for o in needing])
    total = counter.get_total_flops()
    if isinstance(total, int):
        return total, []
    expression = total.node.expr
    return expression, _bindings(inputs, expression.free_symbols)


def _bindings(inputs: list, symbols) -> list[tuple[Any, int, int | None]]:
    """Where each of ``symbols`` is found among the graph's inputs: an integer input, or a tensor's dimension."""
    import torch

    found: dict[Any, tuple[Any, int, int | None]] = {}
    for position, value in enumerate(inputs):
        if isinstance(value, torch.SymInt):
            _bind(found, symbols, value, position, None)
        elif isinstance(value, torch.Tensor):
            for dimension, size in enumerate(value.shape):
                if isinstance(size, torch.SymInt):
                    _bind(found, symbols, size, position, dimension)
    missing = set(symbols) - set(found)
    if missing:
        raise RuntimeError(f"FLOPs depend on sizes no input gives: {sorted(map(str, missing))}")
    return list(found.values())


def _bind(found: dict, symbols, size, position: int, dimension: int | None) -> None:
    expression = size.node.expr
    if expression in symbols and expression not in found:
        found[expression] = (expression, position, dimension)
