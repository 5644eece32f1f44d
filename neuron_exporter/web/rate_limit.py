"""Token buckets per client, for the endpoint's rate limits: a client is its address (an IPv6 /64)."""

from __future__ import annotations

import ipaddress
import time
from collections import OrderedDict

from .. import fork_safe

MAX_CLIENTS = 4096


class TokenBuckets:
    """A bucket per key (a client, see ``client_key``) of up to ``burst`` tokens, gaining one every
    ``refill_seconds``. A key seen for the first time starts full; past ``MAX_CLIENTS`` keys the least recently
    used is forgotten (so memory is bounded, and a forgotten client starts full again)."""

    def __init__(self, burst: int, refill_seconds: float):
        self.burst = burst
        self.refill_seconds = refill_seconds
        self._lock = fork_safe.Lock()
        self._buckets: OrderedDict[str, list[float]] = OrderedDict()  # key -> [tokens, when last refilled]

    def has_token(self, key: str) -> bool:
        return self.seconds_until_token(key) == 0.0

    def is_full(self, key: str) -> bool:
        with self._lock:
            return self._refilled(key)[0] >= self.burst

    def seconds_until_token(self, key: str) -> float:
        with self._lock:
            tokens = self._refilled(key)[0]
        return 0.0 if tokens >= 1 else (1 - tokens) * self.refill_seconds

    def take(self, key: str) -> bool:
        """Take a token if there is one."""
        with self._lock:
            bucket = self._refilled(key)
            if bucket[0] < 1:
                return False
            bucket[0] -= 1
            return True

    def give_back(self, key: str) -> None:
        with self._lock:
            bucket = self._refilled(key)
            bucket[0] = min(bucket[0] + 1, float(self.burst))

    def _refilled(self, key: str) -> list[float]:
        now = time.monotonic()
        bucket = self._buckets.pop(key, None) or [float(self.burst), now]
        self._buckets[key] = bucket  # now the most recently used
        if len(self._buckets) > MAX_CLIENTS:
            self._buckets.popitem(last=False)
        bucket[0] = min(float(self.burst), bucket[0] + (now - bucket[1]) / self.refill_seconds)
        bucket[1] = now
        return bucket


def client_key(address: str) -> str:
    """The rate-limited unit for a client address: the address, or its /64 for IPv6 (one host's usual share)."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if ip.version == 4:
        return str(ip)
    if ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ipaddress.ip_network(f"{ip}/64", strict=False))


class Pacer:
    """Spaces events out to ``per_second`` on average, allowing ``burst`` at once: ``reserve()`` books the next
    event and says how long to wait for it (a generic cell rate algorithm, so waiters are served in turn)."""

    def __init__(self, per_second: float, burst: int):
        self.interval = 1.0 / per_second
        self.tolerance = self.interval * (burst - 1)
        self._lock = fork_safe.Lock()
        self._next = 0.0  # when the next event is due if events came at exactly the average rate

    def reserve(self) -> float:
        with self._lock:
            now = time.monotonic()
            due = max(self._next, now)
            self._next = due + self.interval
            return max(0.0, due - self.tolerance - now)
