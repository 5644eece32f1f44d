"""The torch.compile source: dynamo's records read when compilations start and end, after the first optimizer step
that follows one, and at scrape time (see the package's text)."""

from __future__ import annotations

import logging
import sys
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from ... import fork_safe
from .. import dynamo_callbacks
from ..patching import Patch
from ..self_metrics import SelfStats
from ..sites import UNKNOWN
from ..source import Source
from .diagnosis import torch_compile_part
from .families import TorchCompileFamilies
from .probes import (
    OFF,
    READABLE,
    BreakHook,
    mode_of,
    probe_callbacks,
    probe_graph_breaks,
    probe_records,
    readable,
    torch_version,
)
from .reasons import BREAK_PREFIX, break_reason, failed_guard, guard_reason, shortened
from .records import BreakRecord, FunctionRecord, Places, frame_of, limit_hit

log = logging.getLogger("neuron_exporter")

MAX_FUNCTIONS = 1000  # compiled functions remembered (the metrics' label budget is separate and smaller)
MAX_BREAK_SITES = 1000
MAX_FRAMES = 10_000  # dynamo frame ids remembered, to name the function of a backward or recompile-limit record
MAX_SEEN = 4096  # compile records remembered, so none is counted twice


class TorchCompileSource(Source):
    """Reads dynamo's records of one process; ``families()`` and ``diagnosis()`` serve them."""

    def __init__(
        self,
        max_site_series: int = 50,
        on_error: Callable[[BaseException], None] | None = None,
        stats: SelfStats | None = None,
    ):
        """Failures go to ``on_error``, else are counted in ``stats`` (replaced in a forked child), else logged at
        debug level."""
        self.mode = OFF
        self.version = ""
        self.stats = stats
        self._on_error = on_error or self.step_error
        self._families = TorchCompileFamilies(self, max_site_series)
        self._lock = fork_safe.RLock()
        self._places = Places()
        self._utils: Any = None  # torch._dynamo.utils, whose _compilation_metrics may be replaced by a new deque
        self._listener: dynamo_callbacks.Listener | None = None
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
    def install(self) -> bool:
        """Start reading what dynamo gives on this torch; never raises (an API missing or changed: the others are
        still read, and one log line says what is not); False only if it failed half-way (nothing stays hooked)."""
        try:
            self.version = torch_version()
            self._places = Places()
            records, callbacks = probe_records(), probe_callbacks()
            hook, graph_breaks = probe_graph_breaks()
            if records is None:
                self._read_records()
            if callbacks is None:
                self._listener = dynamo_callbacks.listen(
                    *(
                        (self._on_compile_start, self._on_compile_end)
                        if records is None
                        else (self._counting_start, self._counting_end)
                    ),
                    self._on_error,
                )
            registered = self._listener is not None
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
            return False
        return True

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
        dynamo_callbacks.forget(self._listener)
        self._listener = None
        if self._breaks is not None:
            self._breaks.undo()
            self._breaks = None
        self.poll()  # what was compiled before detach() is still served; nothing compiled after it
        self._utils = None

    def after_fork(self, stats: SelfStats | None = None) -> None:
        """In a forked child: count from zero, as the child's own."""
        self.stats = stats or self.stats
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
        # The records before first: each takes its caller out, so a compile id that comes again after a
        # torch._dynamo.reset() (ids start from 0 again) gets its own.
        self._poll_callback()
        try:
            compile_id = getattr(args, "compile_id", None)
            dynamo = getattr(args, "trigger", "DYNAMO") == "DYNAMO"
            if compile_id is not None and dynamo and compile_id not in self._callers:  # not a backward's
                self._callers[compile_id] = self._places.site(sys._getframe(1))
                if len(self._callers) > MAX_SEEN:
                    self._callers.popitem(last=False)
        except Exception as error:  # noqa: BLE001
            self._on_error(error)

    def _on_compile_end(self, args=None) -> None:
        self._poll_callback()
        self.record_pending = True  # the record of this compilation is added after this callback

    def on_optimizer_step(self, optimizer) -> None:
        if self.record_pending:
            self.check()

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
        if getattr(args, "trigger", "DYNAMO") == "DYNAMO":
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
            record.message = shortened(reason)
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
            if len(self._seen) > len(records):  # a record that left the ring is never read again
                self._seen = OrderedDict.fromkeys(map(_key, records))

    def _seen_before(self, record) -> bool:
        key = _key(record)
        if key in self._seen:
            return True
        self._seen[key] = None
        if len(self._seen) > MAX_SEEN:
            self._seen.popitem(last=False)
        return False

    def _remember_frame(self, record) -> tuple[str, str] | None:
        frame = frame_of(record.compile_id)
        caller = self._callers.pop(record.compile_id, None) if record.is_forward is not False else None
        if record.co_filename and record.is_forward is not False:
            location, skipped = self._places.function_of(record.co_filename, record.co_firstlineno)
            caller = caller if skipped else None
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
        guard = shortened(failed_guard(record.recompile_reason)) if record.recompile_reason else None
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
    def has_compiled(self) -> bool:
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

    def parts(self) -> dict:
        return {"torch_compile": self._families.families}

    def diagnosis(self, rank: dict) -> None:
        rank["torch_compile"] = torch_compile_part(self)


def _key(record) -> tuple:
    return (record.compile_id, record.is_forward, record.is_runtime, record.start_time_us)


def records_maxlen(utils) -> int | None:
    return getattr(utils._compilation_metrics, "maxlen", None)
