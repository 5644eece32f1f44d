"""Worker threads in lanes: each lane has its own workers and its own queue, so a request waits only behind requests
of its lane (a scrape never behind a slow page). In a lane's queue every client address takes its turn, and each
of an address's connections in turn: a client with many connections, or one that pipelines, gets no more turns
than a client with one. Threads start only when a request finds no idle worker of its lane, up to the lane's
number. Nothing here knows a path, a metric or a user.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

Item = TypeVar("Item")


class FairQueue(Generic[Item]):
    """Items taken round robin over their clients, first in first out for each client."""

    def __init__(self) -> None:
        self._by_client: dict[Hashable, deque[Item]] = {}  # in turn order: the next client to serve first
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def put(self, client: Hashable, item: Item) -> None:
        self._by_client.setdefault(client, deque()).append(item)
        self._size += 1

    def get(self) -> Item:
        client = next(iter(self._by_client))
        items = self._by_client.pop(client)
        item = items.popleft()
        if items:
            self._by_client[client] = items  # to the back: every other client goes first
        self._size -= 1
        return item


class Lanes(Generic[Item]):
    """``workers[n]`` threads for lane ``n``; each runs ``handle(item)`` for the items put in its lane (an exception
    is logged at debug level and the worker goes on)."""

    def __init__(self, handle: Callable[[Item], None], workers: Sequence[int], name: str):
        self._handle = handle
        self._name = name
        self._lock = threading.Lock()
        self._ready = [threading.Condition(self._lock) for _ in workers]  # an item in lane n, or stopping
        self._queues: list[FairQueue[Item]] = [FairQueue() for _ in workers]
        self._most = list(workers)
        self._threads: list[list[threading.Thread]] = [[] for _ in workers]
        self._idle = [0 for _ in workers]
        self._stopping = False

    @property
    def threads(self) -> int:
        return sum(map(len, self._threads))

    def put(self, lane: int, client: Hashable, item: Item) -> None:
        with self._lock:
            self._queues[lane].put(client, item)
            if self._idle[lane] < len(self._queues[lane]) and len(self._threads[lane]) < self._most[lane]:
                worker = threading.Thread(target=self._work, args=(lane,), name=self._name, daemon=True)
                try:
                    worker.start()  # it waits for this lock before it counts itself busy
                except RuntimeError as error:  # no thread to be had (a pids limit): the lane's workers serve the queue
                    log.debug("%s: %s", self._name, error)
                else:
                    self._threads[lane].append(worker)
                    self._idle[lane] += 1
            self._ready[lane].notify()

    def stop(self) -> None:
        """Workers end once their current item is handled; items still queued are dropped."""
        with self._lock:
            self._stopping = True
            for ready in self._ready:
                ready.notify_all()

    def _work(self, lane: int) -> None:
        queue = self._queues[lane]
        while True:
            with self._lock:
                self._ready[lane].wait_for(lambda: self._stopping or len(queue) > 0)
                if self._stopping:
                    return
                item = queue.get()
                self._idle[lane] -= 1
            try:
                self._handle(item)
            except Exception as error:  # noqa: BLE001 - a failing item must not end the worker
                log.debug("%s: %s: %s", self._name, type(error).__name__, error)
            with self._lock:
                self._idle[lane] += 1
