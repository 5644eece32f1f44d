"""torch.compile's part of a rank's diagnosis document (``torch_compile``, see ``neuron_exporter.diagnosis``)."""

from __future__ import annotations

from .records import FunctionRecord

MAX_SHOWN = 50  # functions and graph-break sites in the diagnosis document, the worst first (it stays small)


def torch_compile_part(source) -> dict:
    """``source``: the ``TorchCompileSource``."""
    functions, breaks, seconds, counted = source.snapshot()
    return {
        "mode": source.mode,
        "torch_version": source.version,
        "compilations": sum(f.compilations for f in functions) if "source_lines" in source.readable else counted,
        "recompilations": sum(sum(f.recompilations.values()) for f in functions),
        "graph_breaks": sum(b.count for b in breaks),
        "recompile_limit_hits": sum(f.limit_hits for f in functions),
        "compile_seconds": round(seconds, 6),
        "functions": [f.as_dict() for f in sorted(functions, key=_worst_first)[:MAX_SHOWN]],
        "graph_break_sites": [b.as_dict() for b in sorted(breaks, key=lambda b: -b.count)[:MAX_SHOWN]],
        "records_missed": source.missed,
    }


def _worst_first(function: FunctionRecord) -> tuple:
    return -function.limit_hits, -sum(function.recompilations.values()), -function.compilations
