"""Which connection makes room for a new one when the endpoint is full, so that no client address takes the endpoint
from the others.

One client address (an IPv6 /64) holds at most ``MAX_PER_CLIENT`` connections, all addresses together at most
``MAX_CONNECTIONS``. Past either limit, the address that holds the most connections, the newcomer counted, loses
one of its own:

- if that is the newcomer's address (past its own limit, or holding as many as any other), its oldest idle
  connection (``PAUSED``, then ``WAITING``, then ``WAITING_SERVED``) is closed, else the newcomer itself: an address
  whose connections are all at work gets no more of them;
- if it is another address, its oldest connection in the order of ``STATES``, whatever it is doing (a response
  being written or a request being answered too): a flood of busy connections never costs someone else's
  connection, new or kept alive.

Nothing here knows a socket: the connections are whatever the caller keeps, and the caller says what each is doing.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

MAX_CONNECTIONS = 256  # open sockets, waiting or being answered; in a training process they share its file limit
MAX_PER_CLIENT = MAX_CONNECTIONS // 2  # one address's share: pipelining or stalling, it cannot fill the endpoint

# What a connection is doing, in the order connections are closed to make room.
PAUSED = 0  # its client was refused too often: nothing it sends is read for now
WAITING = 1  # for its first request
WAITING_SERVED = 2  # for its next request, after one answered with a 2xx (a scraper that proved itself)
WRITING = 3  # a response, its client reading it or not
BUSY = 4  # a request in its lane, being answered or waiting for a worker
STATES = (PAUSED, WAITING, WAITING_SERVED, WRITING, BUSY)

Connection = TypeVar("Connection", bound=Hashable)


class Admission(Generic[Connection]):
    """The open connections of each client address, oldest first. Only one thread uses it."""

    def __init__(self) -> None:
        self._by_client: dict[str, dict[Connection, None]] = {}
        self._total = 0

    def __len__(self) -> int:
        return self._total

    def count(self, client: str) -> int:
        return len(self._by_client.get(client, ()))

    def add(self, client: str, connection: Connection) -> None:
        self._by_client.setdefault(client, {})[connection] = None
        self._total += 1

    def remove(self, client: str, connection: Connection) -> None:
        own = self._by_client[client]
        del own[connection]
        self._total -= 1
        if not own:
            del self._by_client[client]

    def full_for(self, client: str) -> bool:
        """Whether a new connection of ``client`` needs room made for it."""
        return self._total >= MAX_CONNECTIONS or self.count(client) >= MAX_PER_CLIENT

    def to_close(self, client: str, state: Callable[[Connection], int]) -> Connection | None:
        """The connection to close so that a new one of ``client`` may open (``state(connection)`` says what a
        connection is doing); None: refuse the new one."""
        mine = self.count(client) + 1
        crowded = client
        if mine <= MAX_PER_CLIENT and self._by_client:
            most = max(self._by_client, key=self.count)
            if self.count(most) > mine:
                crowded = most
        own = self._by_client.get(crowded, {})
        if not own:
            return None
        victim = min(own, key=state)  # the oldest of the first state in the order of STATES
        if crowded == client and state(victim) > WAITING_SERVED:
            return None  # the newcomer's address has no idle connection: the newcomer is the one it loses
        return victim
