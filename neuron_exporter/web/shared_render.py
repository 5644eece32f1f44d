"""One render shared by the requests that wait for it, and renders paced.

By default a request is answered with a render that started after the request arrived, so no request gets data
older than itself: requests that arrive while a render runs wait for the next one and all take it. However many
clients ask at once, at most two renders cover them, and the gzip of a render is made once. Past a burst, renders
are paced (``rate_limit.Pacer``): the requests that come while the next render waits for its turn share it too.

With ``reuse_seconds`` (pages), a render that started less than ``reuse_seconds`` ago, or less than
``reuse_factor`` times its own duration ago, is reused, running or done: such a page is rendered at most once per
interval, however many ask for it.

``ask()`` gives a Future: only the request that runs a render (and the one that waits to run the next) keeps its
thread; every other request waits without one.
"""

from __future__ import annotations

import gzip
import time
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from concurrent.futures import wait as wait_for_futures

from .. import fork_safe
from .rate_limit import Pacer

MAX_KEPT = 16  # renders kept (content types, pages); past that, the oldest are forgotten


class Render:
    __slots__ = ("started", "seconds", "body", "content_type", "_gzipped", "_lock")

    def __init__(self, started: float, seconds: float, body: bytes, content_type: str):
        self.started = started
        self.seconds = seconds  # how long it took
        self.body = body
        self.content_type = content_type
        self._gzipped: bytes | None = None
        self._lock = fork_safe.Lock()

    def gzipped(self) -> bytes:
        with self._lock:
            if self._gzipped is None:
                self._gzipped = gzip.compress(self.body, compresslevel=1)
            return self._gzipped


class SharedRender:
    def __init__(self, pacer: Pacer | None = None, reuse_seconds: float = 0.0, reuse_factor: float = 0.0):
        self._pacer = pacer
        self._reuse_seconds = reuse_seconds
        self._reuse_factor = reuse_factor
        self._lock = fork_safe.Lock()
        self._next: dict[Hashable, Future[Render]] = {}  # renders not started yet: whoever asks now shares them
        self._running: dict[Hashable, tuple[float, Future[Render]]] = {}  # by key: when it started, its result
        self._last: dict[Hashable, Render] = {}  # by what was asked (a content type, a page and its format)

    def get(self, key: Hashable, render: Callable[[], tuple[bytes, str]]) -> Render:
        """``ask()``, waited for: ``render``'s exceptions pass through."""
        return self.ask(key, render).result()

    def ask(self, key: Hashable, render: Callable[[], tuple[bytes, str]]) -> Future[Render]:
        """A render of ``key`` (``render()`` gives its body and content type) that started after this call, or
        one recent enough to reuse; the caller runs it if no other request will."""
        arrived = time.monotonic()
        with self._lock:
            last = self._last.get(key)
            if last is not None and self._reusable(last.started, last.seconds, arrived):
                done: Future[Render] = Future()
                done.set_result(last)
                return done
            running = self._running.get(key)
            if running is not None and self._reusable(running[0], 0.0, arrived):
                return running[1]
            shared = self._next.get(key)
            if shared is not None:
                return shared
            future: Future[Render] = Future()
            wait = self._pacer.reserve() if self._pacer is not None and running is None else 0.0
            if running is None and not wait:
                self._running[key] = (arrived, future)
            else:
                self._next[key] = future
        if running is not None or wait:
            if running is not None:  # one render of a key at a time: this one starts when that one ends
                wait_for_futures([running[1]])
                wait = self._pacer.reserve() if self._pacer is not None else 0.0
            if wait:
                time.sleep(wait)  # whoever asks meanwhile shares this render
            with self._lock:
                del self._next[key]
                arrived = time.monotonic()
                self._running[key] = (arrived, future)
        self._run(key, render, arrived, future)
        return future

    def _reusable(self, started: float, seconds: float, now: float) -> bool:
        return started >= now or now - started < max(self._reuse_seconds, self._reuse_factor * seconds)

    def _run(self, key: Hashable, render: Callable[[], tuple[bytes, str]], started: float, future: Future) -> None:
        try:
            body, content_type = render()
        except BaseException as error:
            with self._lock:
                del self._running[key]
            future.set_exception(error)
            if not isinstance(error, Exception):
                raise
            return
        result = Render(started, time.monotonic() - started, body, content_type)
        with self._lock:
            del self._running[key]
            self._last.pop(key, None)
            self._last[key] = result  # now the newest
            if len(self._last) > MAX_KEPT:
                del self._last[next(iter(self._last))]
        future.set_result(result)
