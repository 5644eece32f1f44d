"""Operators that TorchNeuron ran on the CPU: counted per call where it says so per call, and seen otherwise.

TorchNeuron has three CPU fallbacks and one set of their names (see ``names``):
- path b, an operator it registers from Python whose implementation cannot take a call: it runs the call on the CPU
  and calls ``torch_neuronx._C._log_offloaded_op(name)``, looked up at each call. That function is wrapped here, so
  every such call is counted, with the user's line (the innermost frame outside torch, torch_neuronx and this
  package; a call from the backward pass, on an autograd thread with no Python frames, is named by the line the
  training thread is waiting at, as ``fallback_sites`` does on XLA);
- path a, an operator with no Neuron kernel (C++ boxed fallback), and path c, an operator that failed in the
  asynchronous pipeline and ran again on the CPU: no Python call, only the name in the set. The set is read
  (``get_fallback_ops()``, never cleared) at scrape time, and every name it ever held is *seen*.
Everything here is bounded: operators, and lines per operator.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from types import FrameType

from ... import fork_safe
from ..patching import Patch
from ..sites import UNKNOWN, SiteFinder

MAX_OPS = 1000  # operators remembered (the metrics' label budget is separate and smaller)
MAX_SITES_PER_OP = 20


class FallbackCalls:
    def __init__(self, sites: SiteFinder, on_error: Callable[[BaseException], None]):
        self._sites = sites
        self._on_error = on_error
        self._lock = fork_safe.Lock()
        self.calls: dict[str, int] = {}  # path b: op -> calls
        self.sites: dict[str, dict[str, tuple[list[str], bool]]] = {}  # op -> location -> (frames, backward)
        self.seen: set[str] = set()  # every name the set held
        self.training_thread = threading.main_thread().ident
        self._patch: Patch | None = None

    # -- path b ---------------------------------------------------------------------------------------------
    def install(self, c_module) -> bool:
        """Wrap ``c_module._log_offloaded_op`` (``torch_neuronx._C``); whether it went in."""
        self._patch = Patch(c_module, "_log_offloaded_op", self._wrap, self._on_error)
        return self._patch.install()

    def uninstall(self) -> None:
        if self._patch is not None:
            self._patch.undo()

    def _wrap(self, original):
        account = self._called

        def _log_offloaded_op(op_name, *args, **kwargs):
            account(op_name)
            return original(op_name, *args, **kwargs)

        return _log_offloaded_op

    def _called(self, op) -> None:
        try:
            op = str(op)
            frame: FrameType | None = sys._getframe(2)  # past this and the wrapper
            location = self._sites.site(frame)
            backward = False
            thread = self.training_thread
            if location == UNKNOWN and thread is not None and threading.get_ident() != thread:
                frame = sys._current_frames().get(thread)  # waiting in backward()
                location, backward = self._sites.site(frame), True
            with self._lock:
                if op not in self.calls and len(self.calls) >= MAX_OPS:
                    op = "other"
                self.calls[op] = self.calls.get(op, 0) + 1
                lines = self.sites.setdefault(op, {})
                if location not in lines and len(lines) < MAX_SITES_PER_OP:
                    lines[location] = (self._sites.frames(frame), backward)
        except Exception as error:  # noqa: BLE001 (never into the training loop)
            self._on_error(error)

    # -- paths a and c: the set -----------------------------------------------------------------------------
    def read_seen(self, get_fallback_ops) -> set[str]:
        """Every operator the set has held, read now (a copy of the set: no device work)."""
        names = get_fallback_ops()
        with self._lock:
            for name in names:
                if len(self.seen) >= MAX_OPS:
                    break
                self.seen.add(str(name))
            return set(self.seen)

    def snapshot(self) -> tuple[dict[str, int], list[tuple[str, str, list[str], bool]]]:
        """(calls by operator, [(op, location, frames, backward)])."""
        with self._lock:
            return dict(self.calls), [
                (op, location, list(frames), backward)
                for op, lines in self.sites.items()
                for location, (frames, backward) in lines.items()
            ]

    def clear(self) -> None:
        """In a forked child: its own counts from here."""
        self.calls, self.sites, self.seen = {}, {}, set()
