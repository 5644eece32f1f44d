"""torch.compile (dynamo): compilations, recompilations and the guard that failed, functions that hit the recompile
limit, and graph breaks with their reason, each by source line, from torch's own records.

Whatever the backend (inductor, aot_eager, eager, torch_xla's openxla, a vendor's), dynamo records:

- one *compilation record* per frame it compiles, in ``torch._dynamo.utils._compilation_metrics`` (a ring of 64):
  its compile id, the compiled function's code (file, first line), the failed guard that made it a recompilation
  (``tensor 'x' size mismatch at index 0. expected 4, actual 5``), a failure when the function has recompiled too
  often and runs eagerly from then on, and the time spent. The ring is read at the start and end of every
  compilation (dynamo's compile callbacks; the end callback fires before that compilation's record is added), after
  the first optimizer step that follows a compilation, and at scrape time; each record is taken once, by its
  compile id.
- a call of ``log_graph_break`` (``torch._dynamo.symbolic_convert``) for every graph break it finds while tracing,
  with the reason and the user's stack: wrapped here, so it costs something only while dynamo compiles.

Nothing here runs per operator or per call of a compiled function. These are private APIs of torch, and they
change: each is probed before it is read (``probe_records``, ``probe_callbacks``, ``probe_graph_breaks``), and
``log_graph_break``, whose shape changed twice, is read by an adapter per known shape (``BREAK_SHAPES``). Checked
against the source of every torch from 2.9.0 to 2.14.1 and tested on 2.9.0 and 2.14.1. When a probe fails, what
the other APIs give is still counted (without the records: compilations and their time from the compile
callbacks, without lines), one log line says what is not, and ``neuron_exporter_torch_compile_readable`` shows it.
"""

from __future__ import annotations

import inspect
import logging
import re
import sys
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ..untrusted import LabelBudget
from .dynamo_callbacks import CompileCallbacks
from .dynamo_callbacks import problem as probe_callbacks  # the compile callbacks
from .patching import Patch
from .sites import UNKNOWN, SiteFinder

log = logging.getLogger("neuron_exporter")

FULL, PARTIAL, COUNTING, OFF = "full", "partial", "counting", "off"
# What a scrape can say, each readable or not on the torch this process runs (neuron_exporter_torch_compile_readable)
READABLE = ("compilations", "compile_seconds", "source_lines", "recompilations", "recompile_limit_hits", "graph_breaks")
FROM_RECORDS = ("compilations", "compile_seconds", "source_lines", "recompilations", "recompile_limit_hits")
FROM_CALLBACKS = ("compilations", "compile_seconds")  # counted without the records: compile windows, no lines
# A function at the recompile limit: the failure of its compilation record. torch 2.9 and 2.10 raise
# RecompileLimitExceeded; from 2.11 on, an Unsupported graph break of this type; FailOnRecompileLimitHit on all
# (fullgraph=True, or config.fail_on_recompile_limit_hit).
LIMIT_FAILURES = ("RecompileLimitExceeded", "FailOnRecompileLimitHit")
LIMIT_BREAK = "Dynamo recompile limit exceeded"
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
MAX_FUNCTIONS = 1000  # compiled functions remembered (the metrics' label budget is separate and smaller)
MAX_BREAK_SITES = 1000
MAX_FRAMES = 10_000  # dynamo frame ids remembered, to name the function of a backward or recompile-limit record
MAX_SEEN = 4096  # compile records remembered, so none is counted twice
MAX_GUARDS = 3  # failed guards kept per function for the detailed view
MAX_SHOWN = 50  # functions and graph-break sites in the diagnosis document, the worst first (it stays small)
MAX_TEXT = 600
USER_FRAMES = 4

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
    text = _failed_guard(text)
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


def _failed_guard(text: str) -> str:
    """``0/1: tensor 'x' ...`` -> ``tensor 'x' ...``: dynamo prefixes the compile id of the entry whose guard
    failed, and from torch 2.11 appends the user's stack (the guard already names its line)."""
    return re.sub(r"^!?[0-9/]+(_[0-9]+)?: ", "", text.split("\nUser stack trace:", 1)[0].strip())


def _shortened(text: str, limit: int = MAX_TEXT) -> str:
    text = re.sub(r"[ \t]+", " ", text.strip())
    return text if len(text) <= limit else text[: limit - 3] + "..."


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


def limit_hit(record) -> bool:
    """Whether a compilation record is a function at the recompile limit (see ``LIMIT_FAILURES``)."""
    if record.fail_type in LIMIT_FAILURES:
        return True
    return record.fail_type == "Unsupported" and (record.fail_reason or "").startswith(LIMIT_BREAK)


class Places(SiteFinder):
    """Source lines as the site tables show them (``train.py:42``, ``transformers/models/x.py:120``)."""

    def function(self, filename: str | None, line: int | None) -> str:
        """``file:line`` of a compiled function (its first line), wherever it is, torch's own code included."""
        return self.function_of(filename, line)[0]

    def function_of(self, filename: str | None, line: int | None) -> tuple[str, bool]:
        """(``file:line``, whether the file is torch's, this package's or the standard library's)."""
        if not filename:
            return UNKNOWN, True
        shown, skipped, _ = self._file(filename)
        return f"{shown}:{line}", skipped

    def user_site(self, stack: list[tuple[str, int, str]]) -> tuple[str, list[str]]:
        """(site, frames) of a stack of (file, line, function), outermost first: the site is the innermost frame
        outside torch, this package and the standard library (the innermost frame if all are); frames are the user
        frames, innermost first."""
        frames: list[str] = []
        site = None
        for filename, line, name in reversed(stack):
            shown, skipped, _ = self._file(filename)
            if skipped:
                continue
            site = site or f"{shown}:{line}"
            if len(frames) < USER_FRAMES:
                frames.append(f"{name} ({shown}:{line})")
        if site is None and stack:
            filename, line, _ = stack[-1]
            site = f"{self._file(filename)[0]}:{line}"
        return site or UNKNOWN, frames


@dataclass
class FunctionRecord:
    """What dynamo did with one compiled function (a code object, named by its file and first line)."""

    location: str
    name: str = ""
    compilations: int = 0
    recompilations: dict[str, int] = field(default_factory=dict)  # by guard class
    limit_hits: int = 0
    compile_seconds: float = 0.0
    guards: deque = field(default_factory=lambda: deque(maxlen=MAX_GUARDS))  # recent failed guards

    def copy(self) -> FunctionRecord:
        return FunctionRecord(
            self.location,
            self.name,
            self.compilations,
            dict(self.recompilations),
            self.limit_hits,
            self.compile_seconds,
            deque(self.guards, maxlen=MAX_GUARDS),
        )

    def as_dict(self) -> dict:
        return {
            "location": self.location,
            "function": self.name,
            "compilations": self.compilations,
            "recompilations": dict(self.recompilations),
            "recompile_limit_hits": self.limit_hits,
            "compile_seconds": round(self.compile_seconds, 6),
            "failed_guards": list(self.guards),
        }


@dataclass
class BreakRecord:
    """Graph breaks at one user line, for one reason class."""

    location: str
    reason: str
    count: int = 0
    message: str = ""  # dynamo's reason, the last one seen
    frames: list[str] = field(default_factory=list)  # user frames, innermost first
    function: str = ""  # the frame dynamo was compiling, name (file:line)

    def copy(self) -> BreakRecord:
        return BreakRecord(self.location, self.reason, self.count, self.message, list(self.frames), self.function)

    def as_dict(self) -> dict:
        return {
            "location": self.location,
            "reason": self.reason,
            "count": self.count,
            "message": self.message,
            "frames": list(self.frames),
            "compiling": self.function,
        }


FAMILIES = {
    "torch_compile_compilations": (
        "Frames compiled by torch.compile (dynamo), by the compiled function's first line",
        ["location"],
    ),
    "torch_compile_recompilations": (
        "Recompilations by torch.compile after a guard failed, by the compiled "
        "function's first line and the kind of guard",
        ["location", "reason"],
    ),
    "torch_compile_graph_breaks": (
        "Graph breaks found by torch.compile while compiling, by the user line that "
        "broke the graph and the kind of reason",
        ["location", "reason"],
    ),
    "torch_compile_recompile_limit_hits": (
        "Functions that hit torch.compile's recompile limit and run eagerly from then on, by the function's first line",
        ["location"],
    ),
}


class TorchCompileSource:
    """Reads dynamo's records of one process; ``families()`` and ``diagnosis()`` serve them."""

    def __init__(self, max_site_series: int = 50, on_error: Callable[[BaseException], None] | None = None):
        self.mode = OFF
        self.version = ""
        self._on_error = on_error or (lambda error: log.debug("neuron-exporter: torch.compile: %s", error))
        self._budgets = {name: LabelBudget(max_site_series) for name in FAMILIES}
        self._lock = threading.RLock()
        self._places = Places()
        self._utils: Any = None  # torch._dynamo.utils, whose _compilation_metrics may be replaced by a new deque
        self._callbacks: CompileCallbacks | None = None
        self._breaks: Patch | None = None  # the wrapper of log_graph_break
        self.readable: tuple[str, ...] = ()  # of READABLE
        self.record_pending = False  # a compilation ended whose record may not have been read yet
        self._clear()

    def _clear(self) -> None:
        self.functions: dict[str, FunctionRecord] = {}
        self.breaks: dict[tuple[str, str], BreakRecord] = {}
        self.compile_seconds = 0.0
        self.compilations = 0  # counting mode: compile windows seen
        self._frames: dict[str, tuple[str, str]] = {}  # dynamo frame id -> (location, function name)
        self._callers: OrderedDict = OrderedDict()  # compile id -> the user line that called what is compiled
        self._seen: OrderedDict = OrderedDict()
        self._newest: Any = None  # the newest record taken from the ring
        self._counting_since: float | None = None
        self.missed = 0  # records that left the ring before they were read

    # -- life cycle -----------------------------------------------------------------------------------------
    def install(self) -> None:
        """Start reading what dynamo gives on this torch; never raises (an API missing or changed: the others are
        still read, and one log line says what is not)."""
        try:
            self.version = torch_version()
            self._places = Places()
            records, callbacks = probe_records(), probe_callbacks()
            hook, graph_breaks = probe_graph_breaks()
            if records is None:
                self._read_records()
            if callbacks is None:
                self._callbacks = CompileCallbacks(
                    *(
                        (self._on_compile_start, self._on_compile_end)
                        if records is None
                        else (self._counting_start, self._counting_end)
                    ),
                    self._on_error,
                )
            registered = self._callbacks is not None and self._callbacks.register()
            wrapped = hook is not None and self._wrap_graph_breaks(hook)
            self.readable = readable(records is None, registered, wrapped)
            self.mode = mode_of(self.readable)
            self._say_unreadable([problem for problem in (records, callbacks, graph_breaks) if problem])
        except Exception as error:  # noqa: BLE001 (an exporter failure never reaches the training script)
            self.mode, self.readable = OFF, ()
            self._on_error(error)
            try:
                self.uninstall()  # whatever was hooked before the failure
            except Exception as failure:  # noqa: BLE001
                self._on_error(failure)

    def _read_records(self) -> None:
        import torch._dynamo.utils as dynamo_utils

        self._utils = dynamo_utils
        with self._lock:
            for record in list(dynamo_utils._compilation_metrics):  # compiled before attach(): names, not counts
                self._remember_frame(record)
                self._seen_before(record)
                self._newest = record

    def _wrap_graph_breaks(self, hook: BreakHook) -> bool:
        """Whether the wrapper of ``log_graph_break`` went in."""
        source, signature, read = self, hook.signature, hook.read

        def wrap(original):
            def log_graph_break(*args, **kwargs):
                try:
                    found = read(signature.bind(*args, **kwargs).arguments)
                    if found is not None:
                        source._graph_break(*found)
                except Exception as error:  # noqa: BLE001
                    source._on_error(error)
                return original(*args, **kwargs)

            return log_graph_break

        self._breaks = Patch(hook.owner, "log_graph_break", wrap, self._on_error)
        return self._breaks.install()

    def _say_unreadable(self, problems: list[str]) -> None:
        """One log line, if any private API could not be read."""
        if problems:
            unread = [name for name in READABLE if name not in self.readable]
            log.warning(
                "neuron-exporter: torch.compile on torch %s: %s; still counted: %s; not counted: %s",
                self.version,
                "; ".join(problems),
                ", ".join(self.readable) or "nothing",
                ", ".join(unread) or "nothing",
            )

    def uninstall(self) -> None:
        if self._callbacks is not None:
            self._callbacks.remove()
            self._callbacks = None
        if self._breaks is not None:
            self._breaks.undo()
            self._breaks = None
        self.poll()  # what was compiled before detach() is still served; nothing compiled after it
        self._utils = None

    def after_fork(self) -> None:
        """In a forked child: count from zero, as the child's own."""
        self._lock = threading.RLock()  # another thread of the parent may have held it at the fork
        with self._lock:
            newest, utils = self._newest, self._utils
            frames = dict(self._frames)
            self._clear()
            self._frames, self._newest = frames, newest
            if utils is not None:
                for record in list(utils._compilation_metrics):
                    self._seen_before(record)

    # -- the compiling thread -------------------------------------------------------------------------------
    def _poll_callback(self, args=None) -> None:
        try:
            self.poll()
        except Exception as error:  # noqa: BLE001
            self._on_error(error)

    def _on_compile_start(self, args=None) -> None:
        """Dynamo starts compiling: read what came before, and note the user line that called the compiled code
        (what names a compiled module, whose compiled frame is dynamo's own wrapper)."""
        try:
            compile_id = getattr(args, "compile_id", None)
            if compile_id is not None and compile_id not in self._callers:
                self._callers[compile_id] = self._places.site(sys._getframe(1))
                if len(self._callers) > MAX_SEEN:
                    self._callers.popitem(last=False)
        except Exception as error:  # noqa: BLE001
            self._on_error(error)
        self._poll_callback()

    def _on_compile_end(self, args=None) -> None:
        self._poll_callback()
        self.record_pending = True  # the record of this compilation is added after this callback

    def check(self) -> None:
        """After an optimizer step that followed a compilation (the owner's optimizer hook calls this when
        ``record_pending``): read the ring if it has a record not read yet, so a loop without step markers (inductor
        on a GPU) is read as it trains, not only at the next compilation or scrape."""
        self.record_pending = False
        utils = self._utils
        if utils is None:
            return
        ring = utils._compilation_metrics
        if ring and ring[-1] is not self._newest:
            self._poll_callback()

    def _counting_start(self, args=None) -> None:
        if self._counting_since is None:
            self._counting_since = time.perf_counter()
        if getattr(getattr(args, "callback_trigger", None), "name", "DYNAMO") == "DYNAMO":
            self.compilations += 1

    def _counting_end(self, args=None) -> None:
        started, self._counting_since = self._counting_since, None
        if started is not None:
            self.compile_seconds += time.perf_counter() - started

    def _graph_break(self, code_options: dict, reason: str, user_stack) -> None:
        """One graph break, as an adapter of ``BREAK_SHAPES`` read it from dynamo's call."""
        from torch._guards import CompileContext

        code_options, reason = code_options or {}, BREAK_PREFIX.sub("", str(reason or "").strip())
        stack = [(frame.filename, frame.lineno, frame.name) for frame in user_stack]
        if not stack and code_options.get("co_filename"):  # the first instruction of the frame
            stack = [(code_options["co_filename"], code_options.get("co_firstlineno"), code_options.get("co_name"))]
        location, frames = self._places.user_site(stack)
        kind = break_reason(reason)
        compiling = ""
        if code_options.get("co_filename"):
            compiling = (
                f"{code_options.get('co_name', '?')} "
                f"({self._places.function(code_options['co_filename'], code_options.get('co_firstlineno'))}"
                f", compile id {CompileContext.current_compile_id()})"
            )
        with self._lock:
            key = (location, kind)
            record = self.breaks.get(key)
            if record is None:
                if len(self.breaks) >= MAX_BREAK_SITES:
                    key = ("other", kind)
                    record = self.breaks.setdefault(key, BreakRecord("other", kind))
                else:
                    record = self.breaks[key] = BreakRecord(location, kind)
                    log.info("neuron-exporter: torch.compile graph break at %s (%s)", location, kind)
            record.count += 1
            record.message = _shortened(reason)
            record.frames = frames or record.frames
            record.function = compiling

    # -- reading the ring -----------------------------------------------------------------------------------
    def poll(self) -> None:
        """Take every record of the ring not taken yet."""
        utils = self._utils
        if utils is None:
            return
        with self._lock:
            records = list(utils._compilation_metrics)  # one C-level copy, under the GIL
            if not records or records[-1] is self._newest:
                return
            start = 0
            for index in range(len(records) - 1, -1, -1):
                if records[index] is self._newest:
                    start = index + 1
                    break
            else:
                if self._newest is not None and len(records) == records_maxlen(utils):
                    self.missed += 1  # maybe: more than a ring's worth since the last read
            self._newest = records[-1]
            for record in records[start:]:
                if self._seen_before(record):
                    continue
                self._account(record)

    def _seen_before(self, record) -> bool:
        key = (record.compile_id, record.is_forward, record.is_runtime, record.start_time_us)
        if key in self._seen:
            return True
        self._seen[key] = None
        if len(self._seen) > MAX_SEEN:
            self._seen.popitem(last=False)
        return False

    def _remember_frame(self, record) -> tuple[str, str] | None:
        frame = _frame_of(record.compile_id)
        if record.co_filename and record.is_forward is not False:
            location, skipped = self._places.function_of(record.co_filename, record.co_firstlineno)
            caller = self._callers.get(record.compile_id) if skipped else None
            if caller is not None and caller != UNKNOWN:  # torch's own frame (a compiled module's wrapper)
                location = caller
            known = (location, record.co_name or "")
            if frame is not None and (frame in self._frames or len(self._frames) < MAX_FRAMES):
                self._frames[frame] = known
            return known
        return self._frames.get(frame) if frame is not None else None

    def _function(self, location: str, name: str) -> FunctionRecord:
        record = self.functions.get(location)
        if record is None:
            if len(self.functions) >= MAX_FUNCTIONS:
                return self.functions.setdefault("other", FunctionRecord("other"))
            record = self.functions[location] = FunctionRecord(location, name)
        return record

    def _account(self, record) -> None:
        if record.is_runtime:
            return  # runtime autotuning and the like: not a compilation
        seconds = (
            record.duration_us / 1e6 if record.duration_us is not None else record.entire_frame_compile_time_s or 0.0
        )
        self.compile_seconds += seconds
        location, name = self._remember_frame(record) or (UNKNOWN, "")
        function = self._function(location, name)
        function.compile_seconds += seconds
        if record.is_forward is False:
            return  # the backward graph of a compiled frame, compiled at its first backward: time only
        guard = _shortened(_failed_guard(record.recompile_reason)) if record.recompile_reason else None
        if limit_hit(record):
            function.limit_hits += 1
            function.guards.append(
                {
                    "reason": guard_reason(record.recompile_reason),
                    "guard": guard,
                    "compile_id": record.compile_id,
                    "recompile_limit_hit": True,
                }
            )
            log.info("neuron-exporter: torch.compile: %s at %s hit the recompile limit", name or "a function", location)
            return
        function.compilations += 1
        if record.recompile_reason:
            kind = guard_reason(record.recompile_reason)
            function.recompilations[kind] = function.recompilations.get(kind, 0) + 1
            function.guards.append({"reason": kind, "guard": guard, "compile_id": record.compile_id})

    # -- serving --------------------------------------------------------------------------------------------
    @property
    def compiled(self) -> bool:
        """Whether dynamo compiled anything in this process since attach()."""
        self.poll()
        return bool(self.functions or self.breaks or self.compilations)

    def snapshot(self) -> tuple[list[FunctionRecord], list[BreakRecord], float, int]:
        """Copies of (functions, graph-break sites, compile seconds, compilations counted without records)."""
        self.poll()
        with self._lock:
            return (
                [f.copy() for f in self.functions.values()],
                [b.copy() for b in self.breaks.values()],
                self.compile_seconds,
                self.compilations,
            )

    def families(self, labels: dict[str, str]) -> Iterator[Metric]:
        """The ``torch_compile_*`` families of this rank that this torch lets it read, and which those are."""
        if not self.version:
            return  # never installed
        names, values = list(labels), list(labels.values())
        family = GaugeMetricFamily(
            "neuron_exporter_torch_compile_readable",
            "1 if the exporter reads this record "
            "of torch.compile on this torch, 0 if the private API of torch it comes from is "
            "missing or of a shape the exporter does not know (the log says which), by record",
            labels=names + ["record"],
        )
        for name in READABLE:
            family.add_metric(values + [name], float(name in self.readable))
        yield family
        if self.mode == OFF:
            return
        functions, breaks, seconds, counted = self.snapshot()
        if "source_lines" not in self.readable:  # compilations counted from the compile callbacks, without lines
            functions = [FunctionRecord(UNKNOWN, compilations=counted)]
        for name, (documentation, extra) in FAMILIES.items():
            if name.removeprefix("torch_compile_") not in self.readable:
                continue
            budget = self._budgets[name]
            totals: dict[tuple[str, ...], float] = {}
            for key, value in _values(name, functions, breaks):
                key = (budget.label_for(key[0]), *key[1:])
                totals[key] = totals.get(key, 0) + value
            counter = CounterMetricFamily(name, documentation, labels=names + extra)
            for key, value in sorted(totals.items()):
                counter.add_metric(values + list(key), value)
            yield counter
        if "compile_seconds" in self.readable:
            total = CounterMetricFamily(
                "torch_compile_compile_seconds",
                "Time torch.compile spent compiling (dynamo and the backend, forward and backward graphs)",
                labels=names,
            )
            total.add_metric(values, seconds)
            yield total

    def diagnosis(self) -> dict:
        """This rank's ``torch_compile`` part of the diagnosis document (see ``neuron_exporter.diagnosis``)."""
        functions, breaks, seconds, counted = self.snapshot()
        return {
            "mode": self.mode,
            "torch_version": self.version,
            "compilations": sum(f.compilations for f in functions) if "source_lines" in self.readable else counted,
            "recompilations": sum(sum(f.recompilations.values()) for f in functions),
            "graph_breaks": sum(b.count for b in breaks),
            "recompile_limit_hits": sum(f.limit_hits for f in functions),
            "compile_seconds": round(seconds, 6),
            "functions": [f.as_dict() for f in sorted(functions, key=_worst_first)[:MAX_SHOWN]],
            "graph_break_sites": [b.as_dict() for b in sorted(breaks, key=lambda b: -b.count)[:MAX_SHOWN]],
            "records_missed": self.missed,
        }


def _worst_first(function: FunctionRecord) -> tuple:
    return -function.limit_hits, -sum(function.recompilations.values()), -function.compilations


def _values(family: str, functions: list[FunctionRecord], breaks: list[BreakRecord]):
    """((location, other label values...), value) of one family."""
    if family == "torch_compile_compilations":
        return [((f.location,), f.compilations) for f in functions if f.compilations]
    if family == "torch_compile_recompilations":
        return [((f.location, kind), count) for f in functions for kind, count in f.recompilations.items()]
    if family == "torch_compile_recompile_limit_hits":
        return [((f.location,), f.limit_hits) for f in functions if f.limit_hits]
    return [((b.location, b.reason), b.count) for b in breaks]


def _frame_of(compile_id) -> str | None:
    """The frame part of a compile id: ``3`` of ``3/1``; ``!0/3`` of ``!0/3/1`` (compiled autograd)."""
    if not compile_id:
        return None
    text = str(compile_id)
    return text.rsplit("/", 1)[0] if "/" in text else text


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


def records_maxlen(utils) -> int | None:
    return getattr(utils._compilation_metrics, "maxlen", None)
