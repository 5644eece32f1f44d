"""The ``neuron`` backend of ``torch.compile``, emulated as torch-neuronx's ``neuron_dynamo_backend/backend.py`` is
written: aot_autograd with one compiler for forward and backward graphs; each graph becomes a NEFF through the
compilation cache (its key: the graph's code and input shapes), is recorded (``NeuronCompilationMetrics``,
``counters["neuron"]``, ``compilation_time_metrics["torch_neuronx_compile"]``) and runs through an executor; an
executor that fails logs "Execution failed: ..." and "Falling back to original GraphModule execution" and runs the
graph eagerly.

``fail_executions`` makes the next executions fail with that message (the tests' forced failure).
"""

from __future__ import annotations

import hashlib
import logging
import time

import torch
from functorch.compile import make_boxed_func
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.utils import compilation_time_metrics, counters

from .. import _C, device
from .metrics import NeuronCompilationMetrics, record_compilation

logger = logging.getLogger(__name__)  # torch_neuronx.neuron_dynamo_backend.backend
GRAPH_COMPILE_US = 50_000.0
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
fail_executions: list[str] = []  # messages of the next executions to fail


class _SyncingTimes(list):
    """compilation_time_metrics["torch_neuronx_compile"]: iterating it synchronizes (the times are lazy)."""

    def __iter__(self):
        _C._synchronize()
        return super().__iter__()


def _has_collectives(gm: torch.fx.GraphModule) -> bool:
    return any(
        node.op == "call_function" and any(c in getattr(node.target, "__name__", str(node.target)) for c in COLLECTIVES)
        for node in gm.graph.nodes
    )


def neuron_backend_fx_compiler(gm: torch.fx.GraphModule, example_inputs, model_name: str = "model_default"):
    has_collectives = _has_collectives(gm)
    shapes = [tuple(getattr(x, "shape", ())) for x in example_inputs]
    key = hashlib.sha256(f"{gm.code}{shapes}".encode()).hexdigest()[:16]
    started = time.perf_counter()
    where = _C.compile_through_cache(key, GRAPH_COMPILE_US)
    counters["neuron"]["compiled_graphs"] += 1
    if has_collectives:
        counters["neuron"]["graphs_with_collectives"] += 1
    times = compilation_time_metrics.get("torch_neuronx_compile")
    if not isinstance(times, _SyncingTimes):
        times = compilation_time_metrics["torch_neuronx_compile"] = _SyncingTimes(times or [])
    times.append(time.perf_counter() - started)
    record_compilation(
        NeuronCompilationMetrics(
            graph_id=key,
            graph_name=f"{model_name}_{len(times) - 1}",
            model_name=model_name,
            has_collectives=has_collectives,
            graph_node_count=len(gm.graph.nodes),
            timestamp=str(time.time_ns()),
            torch_neuronx_compile_us=0 if where == "persistent" else int(GRAPH_COMPILE_US),
        )
    )

    def execution_wrapper(*inputs):
        try:
            if fail_executions:
                raise RuntimeError(fail_executions.pop(0))
            device.graphs_running += 1
            try:
                return gm.forward(*inputs)
            finally:
                device.graphs_running -= 1
        except Exception as e:  # noqa: BLE001 (as the backend does: any failure runs the graph eagerly)
            logger.error(f"Execution failed: {e}")
            logger.warning("Falling back to original GraphModule execution")
            return gm.forward(*inputs)

    return make_boxed_func(execution_wrapper)


def neuron_backend(gm, example_inputs, *, options=None, mode="default"):
    return aot_autograd(fw_compiler=neuron_backend_fx_compiler, keep_inference_input_mutations=True)(gm, example_inputs)


torch._dynamo.register_backend(neuron_backend, name="neuron")
