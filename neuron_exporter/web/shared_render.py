"""One render shared by the scrapes that wait for it.

A scrape is answered with a render that started after the scrape arrived, so no scrape gets data older than itself;
scrapes that arrive while a render runs wait for the next one and all take it. However many clients scrape at once,
at most two renders cover them, and the gzip of a render is made once.
"""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Callable


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
    def __init__(self):
        self._lock = threading.Lock()
        self._last: dict[str, Render] = {}  # by content type

    def get(self, content_type: str, render: Callable[[], bytes]) -> Render:
        """A render of ``content_type`` that started after this call; ``render``'s exceptions pass through."""
        arrived = time.monotonic()
        with self._lock:
            last = self._last.get(content_type)
            if last is not None and last.started >= arrived:
                return last
            started = time.monotonic()
            result = self._last[content_type] = Render(started, render(), content_type)
            return result
