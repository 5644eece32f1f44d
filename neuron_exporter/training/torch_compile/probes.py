"""Probes of dynamo's private APIs, one per API, each saying what is wrong with it on this torch (None: readable), and
what can be counted given which are readable (``neuron_exporter_torch_compile_readable``)."""

from __future__ import annotations

import inspect
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from ..dynamo_callbacks import problem as probe_callbacks  # the compile callbacks

__all__ = ["probe_callbacks", "probe_graph_breaks", "probe_records"]

FULL, PARTIAL, COUNTING, OFF = "full", "partial", "counting", "off"
# What a scrape can say, each readable or not on the torch this process runs (neuron_exporter_torch_compile_readable)
READABLE = ("compilations", "compile_seconds", "source_lines", "recompilations", "recompile_limit_hits", "graph_breaks")
FROM_RECORDS = ("compilations", "compile_seconds", "source_lines", "recompilations", "recompile_limit_hits")
FROM_CALLBACKS = ("compilations", "compile_seconds")  # counted without the records: compile windows, no lines
RECORD_FIELDS = (
    "compile_id",
    "co_name",
    "co_filename",
    "co_firstlineno",
    "recompile_reason",
    "fail_type",
    "fail_reason",
    "entire_frame_compile_time_s",
    "duration_us",
    "is_forward",
    "is_runtime",
    "start_time_us",
)


def torch_version() -> str:
    import torch

    return str(torch.__version__)


# -- probes: one per private API of dynamo, each says what is wrong with it on this torch (None: readable) ---------
def probe_records() -> str | None:
    """The compilation records: the ring ``torch._dynamo.utils._compilation_metrics`` of ``CompilationMetrics``
    (the same shape from torch 2.9 to 2.14)."""
    import dataclasses

    try:
        import torch._dynamo.utils as dynamo_utils
    except Exception as error:  # noqa: BLE001 (any import failure means: not readable)
        return f"cannot import torch._dynamo.utils: {type(error).__name__}: {error}"
    if not isinstance(getattr(dynamo_utils, "_compilation_metrics", None), deque):
        return "torch._dynamo.utils._compilation_metrics is not a deque"
    record = getattr(dynamo_utils, "CompilationMetrics", None)
    fields = {f.name for f in dataclasses.fields(record)} if dataclasses.is_dataclass(record) else set()
    missing = [name for name in RECORD_FIELDS if name not in fields]
    return f"CompilationMetrics lacks {', '.join(missing)}" if missing else None


@dataclass(frozen=True)
class BreakHook:
    """Dynamo's graph-break call as this torch has it: the module or class that holds ``log_graph_break``, its
    signature, and the adapter that reads a call's arguments."""

    owner: object
    signature: inspect.Signature
    read: Callable[[dict], tuple | None]


def probe_graph_breaks() -> tuple[BreakHook | None, str | None]:
    """(the hook, None) if ``log_graph_break`` has a shape of ``BREAK_SHAPES``, else (None, what it is)."""
    try:
        import torch._dynamo.symbolic_convert as symbolic_convert
        from torch._guards import TracingContext
    except Exception as error:  # noqa: BLE001
        return None, f"cannot import torch._dynamo.symbolic_convert: {type(error).__name__}: {error}"
    if not callable(getattr(TracingContext, "extract_stack", None)):
        return None, "TracingContext.extract_stack is gone"
    for where in ("symbolic_convert", "InstructionTranslatorBase"):
        owner = symbolic_convert if where == "symbolic_convert" else getattr(symbolic_convert, where, None)
        function = vars(owner).get("log_graph_break") if owner is not None else None
        if function is None:
            continue
        try:
            signature = inspect.signature(function)
        except (TypeError, ValueError):
            return None, f"{where}.log_graph_break has no signature"
        read = BREAK_SHAPES.get((where, tuple(signature.parameters)))
        if read is None:
            return None, (
                f"{where}.log_graph_break takes ({', '.join(signature.parameters)}), a shape this "
                "exporter does not know"
            )
        return BreakHook(owner, signature, read), None
    return None, "torch._dynamo.symbolic_convert has no log_graph_break"


# -- adapters: one per shape of log_graph_break; each turns a call's arguments into (code options, reason, user
# stack), or None for a graph break that call does not log --------------------------------------------------------
def _break_with_stack(arguments: dict) -> tuple | None:
    """torch 2.9 (a function) and 2.10 (a method): the user's stack is an argument, or dynamo's current one."""
    from torch._guards import TracingContext

    stack = arguments.get("user_stack")
    return (
        arguments["code_options"],
        arguments.get("reason", ""),
        TracingContext.extract_stack() if stack is None else stack,
    )


def _break_with_exception(arguments: dict) -> tuple | None:
    """torch 2.11 to 2.14: the graph break's exception carries the user's stack (``real_stack``) and is logged once
    (``logged``, set by the call)."""
    from torch._guards import TracingContext

    exception = arguments["exc"]
    if getattr(exception, "logged", False):
        return None
    stack = getattr(exception, "real_stack", None)
    return (
        arguments["code_options"],
        arguments.get("reason", ""),
        TracingContext.extract_stack() if stack is None else stack,
    )


# (where log_graph_break is, its parameters) -> its adapter, for every torch from 2.9.0 to 2.14.1
BREAK_SHAPES: dict[tuple[str, tuple[str, ...]], Callable] = {
    ("symbolic_convert", ("code_options", "reason", "exc_info", "user_stack")): _break_with_stack,  # 2.9
    ("InstructionTranslatorBase", ("self", "code_options", "reason", "user_stack")): _break_with_stack,  # 2.10
    ("InstructionTranslatorBase", ("self", "code_options", "reason", "exc")): _break_with_exception,  # 2.11-2.14
}


def readable(records: bool, callbacks: bool, graph_breaks: bool) -> tuple[str, ...]:
    """What can be counted, of READABLE, given which private APIs are readable."""
    found = FROM_RECORDS if records else FROM_CALLBACKS if callbacks else ()
    return found + (("graph_breaks",) if graph_breaks else ())


def mode_of(found: tuple[str, ...]) -> str:
    """full: everything; counting: compilations without lines (no records); partial: some other part missing."""
    if set(READABLE) <= set(found):
        return FULL
    if not found:
        return OFF
    return COUNTING if "compilations" in found and "source_lines" not in found else PARTIAL
