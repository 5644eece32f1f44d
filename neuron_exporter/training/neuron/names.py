"""Every name of TorchNeuron (torch-neuronx 2.13 / 2.14, the native ``neuron`` device) the exporter reads, each
with the page of AWS's documentation (awsdocs-neuron, under ``torch/``) or the torch-neuronx source file it comes
from, and a probe: what is wrong with it in this process, None if it is readable as described.

TorchNeuron is a public beta: none of these names is promised to stay. Each record the exporter serves depends on
some of them (``RECORDS``); a record whose names are missing or of another shape is not served, the rest are, and
``neuron_exporter_torchneuron_readable{record}`` says which (one log line names the problem).

Never read, because they synchronize the device (compile/reference-torch-compile; ``neuron_dynamo_backend/
metrics.py``): ``torch_neuronx.get_dynamo_metrics()`` (and ``torch.neuron.get_dynamo_metrics()``), and iterating
``torch._dynamo.utils.compilation_time_metrics["torch_neuronx_compile"]``. Never called, because they change the
user's state: ``torch_neuronx.clear_op_tracking()``, ``reset_dynamo_metrics()``, ``metrics.set_enabled()``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass

LIBRARY = "torch_neuronx"
BACKEND_LOGGER = "torch_neuronx.neuron_dynamo_backend.backend"
FALLBACK_LINE = "Falling back to original GraphModule execution"  # a compiled graph that failed runs eagerly
FAILURE_PREFIX = "Execution failed: "  # the line before it, with the failure
COUNTERS_KEY = "neuron"  # torch._dynamo.utils.counters["neuron"]
# The compile cache's lookups, split by tier (newer builds), or only their sums, which every build has ("for backward
# compatibility", and the keys a user's own callback reads); and its compilations.
SPLIT_KEYS = ("in_memory_hits", "in_memory_misses", "persistent_hits")
AGGREGATE_KEYS = ("cache_hits", "cache_misses")
COMPILATION_KEYS = ("total_compilations", "total_compilation_time_ms")
MEMORY_KEYS = ("allocated_bytes", "active_bytes", "num_ooms", "num_alloc_retries")


@dataclass(frozen=True)
class Name:
    path: str  # as the user would write it
    source: str  # where it is documented
    probe: Callable[[], str | None]


def _neuronx():
    return sys.modules.get(LIBRARY)


def _callable(owner, attribute: str, shown: str) -> str | None:
    if owner is None:
        return f"{shown}: not imported"
    return None if callable(getattr(owner, attribute, None)) else f"{shown} is missing"


def _probe_offloaded() -> str | None:
    neuronx = _neuronx()
    return _callable(getattr(neuronx, "_C", None), "_log_offloaded_op", "torch_neuronx._C._log_offloaded_op")


def _probe_fallback_ops() -> str | None:
    neuronx = _neuronx()
    problem = _callable(neuronx, "get_fallback_ops", "torch_neuronx.get_fallback_ops")
    if problem:
        return problem
    found = neuronx.get_fallback_ops()  # a copy of a set of names: no device work
    if not isinstance(found, (list, tuple, set, frozenset)) or not all(isinstance(op, str) for op in found):
        return f"torch_neuronx.get_fallback_ops() returned {type(found).__name__}, not names"
    return None


def _probe_cache() -> str | None:
    read = getattr(getattr(_neuronx(), "_C", None), "_get_compilation_cache_stats", None)
    if not callable(read):
        return "torch_neuronx._C._get_compilation_cache_stats is missing"
    stats = read()
    if not isinstance(stats, dict):
        return f"_get_compilation_cache_stats() returned {type(stats).__name__}, not a dict"
    lookups = min(
        ([key for key in keys if not _number(stats.get(key))] for keys in (SPLIT_KEYS, AGGREGATE_KEYS)), key=len
    )
    missing = lookups + [key for key in COMPILATION_KEYS if not _number(stats.get(key))]
    return f"_get_compilation_cache_stats() lacks {', '.join(missing)}" if missing else None


def cache_lookups(stats: dict) -> dict[str, float]:
    """The hits of ``_get_compilation_cache_stats()`` by tier (``memory``, ``persistent``) and its ``misses``, NEFFs
    found in neither and compiled: from the split by tier where the build has it (``in_memory_misses`` counts the
    lookups that went on to the persistent cache, so a miss of both is one of those not found there), else from the
    sums, whose hits are of an ``unknown`` tier."""
    if any(key in stats for key in SPLIT_KEYS):
        persistent = float(stats.get("persistent_hits") or 0)
        return {
            "memory": float(stats.get("in_memory_hits") or 0),
            "persistent": persistent,
            "misses": max(0.0, float(stats.get("in_memory_misses") or 0) - persistent),
        }
    return {"unknown": float(stats.get("cache_hits") or 0), "misses": float(stats.get("cache_misses") or 0)}


def _probe_counters() -> str | None:
    try:
        from torch._dynamo.utils import counters
    except Exception as error:  # noqa: BLE001 (any import failure means: not readable)
        return f"cannot import torch._dynamo.utils.counters: {type(error).__name__}"
    return None if hasattr(counters, "get") else "torch._dynamo.utils.counters is not a mapping"


def _probe_backend_logger() -> str | None:
    return None if BACKEND_LOGGER in sys.modules else f"{BACKEND_LOGGER} is not imported"


def _probe_memory() -> str | None:
    import torch

    read = getattr(getattr(torch, "neuron", None), "memory_stats", None)  # torch.neuron: registered by TorchNeuron
    if not callable(read):
        return "torch.neuron.memory_stats is missing"
    stats = read()
    parts = {"active_bytes": "peak"}
    missing = [key for key in MEMORY_KEYS if memory_value(stats, key, parts.get(key)) is None]
    return f"torch.neuron.memory_stats() lacks {', '.join(missing)}" if missing else None


NAMES = {
    "offloaded_op": Name(
        "torch_neuronx._C._log_offloaded_op(name)",
        "torch-neuronx python_ops/base.py (Operation.__call__, looked up at each call); torch/about-pytorch-neuron",
        _probe_offloaded,
    ),
    "fallback_ops": Name(
        "torch_neuronx.get_fallback_ops()",
        "torch/about-pytorch-neuron (CPU fallback); csrc/core/NeuronOpTracking.cpp",
        _probe_fallback_ops,
    ),
    "cache_stats": Name(
        "torch_neuronx._C._get_compilation_cache_stats()",
        "csrc/core/compilation/CompilationCache.cpp; torch/reference/env-vars (TORCH_NEURONX_METRICS_ENABLED)",
        _probe_cache,
    ),
    "dynamo_counters": Name(
        'torch._dynamo.utils.counters["neuron"]',
        "torch/compile/reference-torch-compile (compiled_graphs, graphs_with_collectives)",
        _probe_counters,
    ),
    "backend_logger": Name(
        f'logger "{BACKEND_LOGGER}": "{FAILURE_PREFIX}...", "{FALLBACK_LINE}"',
        "torch/compile/about-torch-compile; neuron_dynamo_backend/backend.py",
        _probe_backend_logger,
    ),
    "memory_stats": Name(
        "torch.neuron.memory_stats()",
        "torch/about-pytorch-neuron (device memory); csrc metrics DeviceMemoryStatsRegistry",
        _probe_memory,
    ),
}

# What a scrape serves -> the names it needs
RECORDS = {
    "fallback_op_calls": ("offloaded_op",),
    "fallback_ops_seen": ("fallback_ops",),
    "compile_cache": ("cache_stats",),
    "compiled_graphs": ("dynamo_counters",),
    "graph_fallbacks": ("backend_logger",),
    "memory": ("memory_stats",),
}


def probe() -> dict[str, str]:
    """name -> what is wrong with it, for every name that is not readable. Reads nothing that syncs the device."""
    problems = {}
    for key, name in NAMES.items():
        try:
            problem = name.probe()
        except Exception as error:  # noqa: BLE001 (a probe that fails means: not readable)
            problem = f"{name.path} failed: {type(error).__name__}: {error}"
        if problem:
            problems[key] = problem
    return problems


def metrics_off() -> bool:
    """Whether TorchNeuron says its metrics are off (``_C._neuron_metrics_enabled()``; TORCH_NEURONX_METRICS_ENABLED,
    torch/reference/env-vars): the compile cache's counters live among them, and may then stay at 0."""
    enabled = getattr(getattr(_neuronx(), "_C", None), "_neuron_metrics_enabled", None)
    try:
        return callable(enabled) and enabled() is False
    except Exception:  # noqa: BLE001 (not known: say nothing)
        return False


def readable(problems: dict[str, str]) -> tuple[str, ...]:
    return tuple(record for record, needs in RECORDS.items() if not any(name in problems for name in needs))


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def memory_value(stats, key: str, part: str | None = None) -> float | None:
    """A value of ``torch.neuron.memory_stats()``, flattened (``active_bytes.peak``, as ``torch.cuda.memory_stats``)
    or nested (``{"active_bytes": {"peak": ...}}``, as ``torch_neuronx._C._get_memory_stats``); ``allocated_bytes``
    alone is its current value. None if absent."""
    if not isinstance(stats, dict):
        return None
    if part is None:
        value = stats.get(key)
        if isinstance(value, dict):
            value = value.get("current")
        if value is None:
            value = stats.get(f"{key}.current")
    else:
        nested = stats.get(key)
        value = nested.get(part) if isinstance(nested, dict) else stats.get(f"{key}.{part}")
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
