"""Times read from the spool, judged on the reader's own clocks.

A rank file's modification time and a rank's last step time come from whoever wrote them, and a clock can step (NTP
after a boot, a virtual machine resumed, a clock set back by hand, a ``touch``): taken as they are, a time ahead of
now keeps a dead rank served, and a rank that stopped stepping ``running``, for as long as the time lies ahead. So a
time is never taken as later than when the reader first saw it, and how long it has stood still is also measured on
the reader's monotonic clock from when the reader last saw it change: the older of the two counts.
"""

from __future__ import annotations

import time
from collections.abc import Hashable, Iterable


class SeenTimes:
    def __init__(self) -> None:
        self._changed: dict[Hashable, tuple[object, float, float]] = {}  # key -> (value, wall, monotonic) at change

    def age(self, key: Hashable, value: object, stamp: float, now: float | None = None) -> tuple[float, float]:
        """``(time, seconds)``: ``stamp`` (a unix time) capped at when ``value`` of ``key`` was last seen to change,
        and how long ago that is, on whichever of the wall clock and the monotonic one says longer. ``value`` is what
        counts as a change (a rank rewriting its file before its first step has not moved on)."""
        now = time.time() if now is None else now
        monotonic = time.monotonic()
        changed = self._changed.get(key)
        if changed is None or changed[0] != value:
            changed = self._changed[key] = (value, now, monotonic)
        capped = min(stamp, changed[1])
        return capped, max(now - capped, monotonic - changed[2])

    def keep_only(self, keys: Iterable[Hashable]) -> None:
        """Forget every key but ``keys`` (the ranks or files still there)."""
        keep = set(keys)
        self._changed = {key: changed for key, changed in self._changed.items() if key in keep}
