"""Stand-in for TorchNeuron's extension module, ``torch_neuronx._C``: the bindings the exporter may read, with the
shapes of torch-neuronx's ``csrc`` (``_log_offloaded_op``, the op tracking set, the compilation cache's statistics,
the memory statistics), kept in plain Python. The state is this module's, as the real one's is the process's."""

from __future__ import annotations

import threading

_lock = threading.Lock()
fallback_ops: set[str] = set()  # FallbackOpTracker: names, no counts
executed_ops: set[str] = set()
offloaded_calls: dict[str, int] = {}  # what the tests compare with: every _log_offloaded_op call
syncs = 0  # stream synchronizations (torch_neuronx.synchronize, device-to-host copies)
metrics_enabled = True
cache = {
    "in_memory_hits": 0,
    "in_memory_misses": 0,
    "persistent_hits": 0,
    "persistent_misses": 0,
    "evictions": 0,
    "total_compilations": 0,
    "compilation_time_us": 0.0,
    "memory_usage_bytes": 0,
}
cache_keys: set[str] = set()  # in memory
persistent_keys: set[str] = set()  # on disk
memory = {
    "allocated_bytes": {"current": 0, "peak": 0, "allocated": 0, "freed": 0},
    "reserved_bytes": {"current": 0, "peak": 0, "allocated": 0, "freed": 0},
    "active_bytes": {"current": 0, "peak": 0, "allocated": 0, "freed": 0},
    "num_alloc_retries": 0,
    "num_ooms": 0,
    "num_tensor_frees": 0,
    "allocation_requests": 0,
}


def _log_offloaded_op(op_name: str) -> None:
    """Python-registered op that ran on the CPU (path b): logged once per name in the real one, tracked always."""
    with _lock:
        fallback_ops.add(op_name)
        offloaded_calls[op_name] = offloaded_calls.get(op_name, 0) + 1


def _log_executed_op(op_name: str) -> None:
    executed_ops.add(op_name)


def _track_fallback(op_name: str) -> None:
    """The C++ boxed fallback (path a) adds to the set, with no Python call."""
    with _lock:
        fallback_ops.add(op_name)


def _get_fallback_ops() -> list[str]:
    with _lock:
        return sorted(fallback_ops)


def _get_executed_ops() -> list[str]:
    with _lock:
        return sorted(executed_ops)


def _clear_op_tracking() -> None:
    with _lock:
        fallback_ops.clear()
        executed_ops.clear()


def _synchronize() -> None:
    global syncs
    with _lock:
        syncs += 1


def _neuron_metrics_enabled() -> bool:
    return metrics_enabled


def compile_through_cache(key: str, compile_us: float) -> str:
    """A NEFF looked up by its cache key, compiled on a miss: 'memory', 'persistent' or 'compiled'."""
    with _lock:
        if key in cache_keys:
            cache["in_memory_hits"] += 1
            return "memory"
        cache["in_memory_misses"] += 1
        cache_keys.add(key)
        if key in persistent_keys:
            cache["persistent_hits"] += 1
            return "persistent"
        cache["persistent_misses"] += 1
        persistent_keys.add(key)
        cache["total_compilations"] += 1
        cache["compilation_time_us"] += compile_us
        cache["memory_usage_bytes"] += 1024
        return "compiled"


def _clear_compilation_memory_cache() -> None:
    """The in-memory cache only: the next lookups find their NEFFs on disk."""
    with _lock:
        cache_keys.clear()


def _get_compilation_cache_stats() -> dict:
    with _lock:
        hits = cache["in_memory_hits"] + cache["persistent_hits"]
        misses = cache["in_memory_misses"] + cache["persistent_misses"]
        return {
            "total_entries": len(cache_keys),
            "in_memory_hits": cache["in_memory_hits"],
            "in_memory_misses": cache["in_memory_misses"],
            "persistent_hits": cache["persistent_hits"],
            "persistent_misses": cache["persistent_misses"],
            "cache_hits": hits,
            "cache_misses": misses,
            "hit_rate": hits / (hits + misses) if hits + misses else 0.0,
            "memory_usage_bytes": cache["memory_usage_bytes"],
            "total_compilation_time_ms": cache["compilation_time_us"] / 1000.0,
            "evictions_performed": cache["evictions"],
            "total_compilations": cache["total_compilations"],
            "max_cache_size_bytes": 1 << 30,
            "max_cache_entries": 10_000,
            "memory_utilization_ratio": cache["memory_usage_bytes"] / (1 << 30),
        }


def allocated(nbytes: int) -> None:
    with _lock:
        memory["allocation_requests"] += 1
        for key in ("allocated_bytes", "active_bytes", "reserved_bytes"):
            stat = memory[key]
            stat["current"] += nbytes
            stat["allocated"] += nbytes
            stat["peak"] = max(stat["peak"], stat["current"])


def freed(nbytes: int) -> None:
    with _lock:
        memory["num_tensor_frees"] += 1
        for key in ("allocated_bytes", "active_bytes"):
            stat = memory[key]
            stat["current"] -= nbytes
            stat["freed"] += nbytes


def _get_memory_stats(device_index: int) -> dict:
    with _lock:
        return {key: dict(value) if isinstance(value, dict) else value for key, value in memory.items()}
