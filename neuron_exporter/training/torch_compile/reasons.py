"""Failed guards and graph-break reasons reduced to bounded classes (the ``reason`` label of the torch_compile_*
families), from dynamo's own messages."""

from __future__ import annotations

import re

MAX_TEXT = 600

# The failed guard of a recompilation, reduced to a bounded class: (class, pattern), the first that matches wins.
GUARD_REASONS = (
    ("size_mismatch", re.compile(r"size mismatch at index|\.size\(\)|\bsize\(\)\[|\.numel\(\)")),
    ("stride_mismatch", re.compile(r"stride mismatch at index|\.stride\(\)|storage_offset\(\)")),
    ("rank_mismatch", re.compile(r"rank mismatch|\.dim\(\)|\.ndim\b")),
    ("dtype_mismatch", re.compile(r"dtype mismatch")),
    ("device_mismatch", re.compile(r"device index mismatch|device mismatch|DEFAULT_DEVICE")),
    ("requires_grad_mismatch", re.compile(r"requires_grad mismatch")),
    ("dispatch_key_mismatch", re.compile(r"dispatch key set mismatch")),
    ("global_state", re.compile(r"GLOBAL_STATE|TORCH_FUNCTION_MODE_STACK|grad_mode|autocast")),
    ("tensor_aliasing", re.compile(r"Duplicate tensor found|aliasing|are aliased")),
    ("type_mismatch", re.compile(r"___check_type_id|TYPE_MATCH|\bisinstance\(")),
    ("id_mismatch", re.compile(r"___check_obj_id|ID_MATCH|\bis None\b|\bis not None\b")),
    ("value_changed", re.compile(r"==|!=|<=|>=|<|>|EQUALS_MATCH|\bnot\b")),
)
RECOMPILE_REASONS = tuple(name for name, _ in GUARD_REASONS) + ("other",)

# A graph break's reason (dynamo's message; its first line names the kind), reduced to a bounded class.
BREAK_REASONS = (
    ("print", re.compile(r"builtin operator `print`|`print`|\blogging\b|reorderable_logging_functions")),
    ("data_dependent_branch", re.compile(r"^Data-dependent (branching|assertion)|attempted to jump with")),
    (
        "tensor_value",
        re.compile(
            r"Tensor\.item\(\)|Tensor\.tolist\(\)|Tensor\.numpy\(\)|^Data dependent operator|"
            r"^Dynamic shape operator|^Dynamic slicing|unbacked|capture_scalar_outputs"
        ),
    ),
    ("explicit", re.compile(r"torch\._dynamo\.graph_break\(\)")),
    ("disabled_function", re.compile(r"torch\.compiler\.disable\(\)|marked as skipped|^Forced graph break")),
    ("autograd", re.compile(r"Tensor\.backward\(\)|_ImperativeEngine|autograd\.Function|^Tensor with grad_fn")),
    ("context_manager", re.compile(r"context manager|GenericContextWrappingVariable|contextlib")),
    ("store_attr", re.compile(r"STORE_ATTR|attribute assignment|setattr")),
    ("unsupported_builtin", re.compile(r"builtin")),
    (
        "unsupported_call",
        re.compile(
            r"^Unsupported (function|method) call|not implemented in python|"
            r"implemented in C/C\+\+|^Unsupported"
        ),
    ),
)
GRAPH_BREAK_REASONS = tuple(name for name, _ in BREAK_REASONS) + ("other",)
# From torch 2.10, a graph break at a call or a comparison says so before the reason itself.
BREAK_PREFIX = re.compile(r"^Encountered graph break when attempting to trace [^\n]*\n+")


def guard_reason(text: str | None) -> str:
    """The class of a failed guard (a compilation record's ``recompile_reason``)."""
    if not text:
        return "other"
    text = failed_guard(text)
    for name, pattern in GUARD_REASONS:
        if pattern.search(text):
            return name
    return "other"


def break_reason(text: str | None) -> str:
    """The class of a graph break's reason (dynamo's message)."""
    text = BREAK_PREFIX.sub("", (text or "").strip())
    for name, pattern in BREAK_REASONS:
        if pattern.search(text):
            return name
    return "other"


def failed_guard(text: str) -> str:
    """``0/1: tensor 'x' ...`` -> ``tensor 'x' ...``: dynamo prefixes the compile id of the entry whose guard
    failed, and from torch 2.11 appends the user's stack (the guard already names its line)."""
    return re.sub(r"^!?[0-9/]+(_[0-9]+)?: ", "", text.split("\nUser stack trace:", 1)[0].strip())


def shortened(text: str, limit: int = MAX_TEXT) -> str:
    text = re.sub(r"[ \t]+", " ", text.strip())
    return text if len(text) <= limit else text[: limit - 3] + "..."
