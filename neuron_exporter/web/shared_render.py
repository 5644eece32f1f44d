"""One render shared by the requests that wait for it, and renders paced.

A request is answered with a render that started after the request arrived, so no request gets data older than
itself; requests that arrive while a render runs wait for the next one and all take it. However many clients ask at
once, at most two renders cover them, and the gzip of a render is made once. Past a burst, renders are paced
(``rate_limit.Pacer``): the requests that come while the next render waits for its turn share it too.
"""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Callable, Hashable

from .rate_limit import Pacer

MAX_KEPT = 16  # renders kept (content types, pages with their queries); past that, the oldest are forgotten


class Render:
    __slots__ = ("started", "body", "content_type", "_gzipped", "_lock")

    def __init__(self, started: float, body: bytes, content_type: str):
        self.started = started
        self.body = body
        self.content_type = content_type
        self._gzipped: bytes | None = None
        self._lock = threading.Lock()

    def gzipped(self) -> bytes:
        with self._lock:
            if self._gzipped is None:
                self._gzipped = gzip.compress(self.body, compresslevel=1)
            return self._gzipped


class SharedRender:
    def __init__(self, pacer: Pacer | None = None):
        self._pacer = pacer
        self._lock = threading.Lock()
        self._last: dict[Hashable, Render] = {}  # by what was asked (a content type, a page and its format)

    def get(self, key: Hashable, render: Callable[[], tuple[bytes, str]]) -> Render:
        """A render of ``key`` (``render()`` gives its body and content type) that started after this call;
        ``render``'s exceptions pass through."""
        arrived = time.monotonic()
        with self._lock:
            last = self._last.get(key)
            if last is not None and last.started >= arrived:
                return last
            wait = self._pacer.reserve() if self._pacer is not None else 0.0
            if wait:
                time.sleep(wait)  # holding the lock: whoever comes meanwhile takes this render
            started = time.monotonic()
            body, content_type = render()
            result = self._last[key] = Render(started, body, content_type)
            if len(self._last) > MAX_KEPT:  # clients choose page queries: keep what is kept bounded
                del self._last[next(iter(self._last))]
            return result
