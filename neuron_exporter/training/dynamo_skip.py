"""Keep torch.compile (dynamo) out of the exporter's own code.

While a compiled function runs, dynamo compiles every Python frame it enters. A host read or a step marker in
the eager part of a compiled function (at a graph break) enters the exporter's wrappers; dynamo would then try to
compile them, fail on torch_xla's bindings and break more graphs. Marking the wrappers' code objects "skip, and
skip everything they call" costs nothing per call (unlike ``torch._dynamo.disable``, which wraps every call).
The API is private (``torch._C._dynamo.eval_frame.set_code_exec_strategy``, torch 2.6 and later): without it,
nothing is marked and the wrappers are still taken off while dynamo traces (see ``host_reads``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from .import_watch import after_import


def never_traced(*functions: Callable) -> None:
    """Mark ``functions`` now, or when dynamo is imported: importing it here would cost a process that never
    compiles most of a second."""
    if "torch._dynamo" in sys.modules:
        _mark(functions)
    else:
        after_import("torch._dynamo", lambda: _mark(functions))


def standing_in(wrapper: Callable, original: Callable) -> Callable:
    """``wrapper``, dressed as ``original`` (its name, qualified name and docstring, and ``__wrapped__``), and never
    traced: what every exporter wrapper of someone else's function is."""
    name = getattr(original, "__name__", wrapper.__name__)
    wrapper.__name__ = name
    wrapper.__qualname__ = getattr(original, "__qualname__", name)
    wrapper.__doc__ = getattr(original, "__doc__", None)
    wrapper.__wrapped__ = original  # type: ignore[attr-defined]
    never_traced(wrapper)
    return wrapper


def _mark(functions: tuple[Callable, ...]) -> None:
    try:
        from torch._C._dynamo.eval_frame import set_code_exec_strategy
        from torch._dynamo.types import FrameAction, FrameExecStrategy
    except Exception:  # noqa: BLE001 (an older or changed torch: nothing is marked)
        return
    strategy = FrameExecStrategy(FrameAction.SKIP, FrameAction.SKIP)
    for function in functions:
        set_code_exec_strategy(function.__code__, strategy)
