"""What torch.compile's source keeps of dynamo's records: compiled functions, graph-break sites, and the source lines
that name them."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from ..sites import UNKNOWN, SiteFinder

# A function at the recompile limit: the failure of its compilation record. torch 2.9 and 2.10 raise
# RecompileLimitExceeded; from 2.11 on, an Unsupported graph break of this type; FailOnRecompileLimitHit on all
# (fullgraph=True, or config.fail_on_recompile_limit_hit).
LIMIT_FAILURES = ("RecompileLimitExceeded", "FailOnRecompileLimitHit")
LIMIT_BREAK = "Dynamo recompile limit exceeded"
MAX_GUARDS = 3  # failed guards kept per function for the detailed view
USER_FRAMES = 4


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


def frame_of(compile_id) -> str | None:
    """The frame part of a compile id: ``3`` of ``3/1``; ``!0/3`` of ``!0/3/1`` (compiled autograd)."""
    if not compile_id:
        return None
    text = str(compile_id)
    return text.rsplit("/", 1)[0] if "/" in text else text
