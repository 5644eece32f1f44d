"""Which connection makes room for a new one when the endpoint is full, so that no client address takes the endpoint
from the others.

One client address (an IPv6 /64) holds at most ``MAX_PER_CLIENT`` connections, all addresses together at most
``MAX_CONNECTIONS``. Past either limit, the address that holds the most connections, the newcomer counted, loses
one of its own:

- if it is another address, its oldest connection in the order of ``STATES``, whatever it is doing (a response
  being written or a request being answered too): a flood of busy connections never costs someone else's
  connection, new or kept alive;
- if it is the newcomer's own (past its own limit, or holding as many as any other), its oldest idle connection
  (``PAUSED``, then ``WAITING``, then ``WAITING_SERVED``);
- if that address has none idle but is within its own limit (many addresses holding as many each, the endpoint
  full), the connection idle the longest (since it opened or since its last answer) of the addresses that hold as
  many: a crowd of addresses with one connection each cannot lock a new scraper out while any of them sits idle,
  and a scraper's new connection, idle the shortest, is the last to go;
- else the newcomer itself: an address whose connections are all at work gets no more of them.

Nothing here knows a socket: the connections are whatever the caller keeps, and the caller says what each is doing.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator
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
        self._opened: dict[Connection, str] = {}  # every connection and its client, idle the longest first
        self._total = 0
        # How many addresses hold each number of connections, and the most any holds: a crowd of addresses, each
        # opening a connection again as soon as it loses one, makes every accept ask, so asking costs no scan.
        self._holding: dict[int, int] = {}
        self._most = 0

    def __len__(self) -> int:
        return self._total

    def __iter__(self) -> Iterator[Connection]:
        """Every open connection, idle the longest first."""
        return iter(self._opened)

    def count(self, client: str) -> int:
        return len(self._by_client.get(client, ()))

    def add(self, client: str, connection: Connection) -> None:
        own = self._by_client.setdefault(client, {})
        self._recount(len(own), len(own) + 1)
        own[connection] = None
        self._opened[connection] = client
        self._total += 1

    def remove(self, client: str, connection: Connection) -> None:
        own = self._by_client[client]
        self._recount(len(own), len(own) - 1)
        del own[connection]
        del self._opened[connection]
        self._total -= 1
        if not own:
            del self._by_client[client]

    def _recount(self, before: int, after: int) -> None:
        if before:
            self._holding[before] -= 1
        if after:
            self._holding[after] = self._holding.get(after, 0) + 1
        self._most = max(self._most, after)
        while self._most and not self._holding.get(self._most):
            self._most -= 1

    def touch(self, connection: Connection) -> None:
        """``connection`` was answered and waits again: its idle time starts now."""
        self._opened[connection] = self._opened.pop(connection)

    def full_for(self, client: str) -> bool:
        """Whether a new connection of ``client`` needs room made for it."""
        return self._total >= MAX_CONNECTIONS or self.count(client) >= MAX_PER_CLIENT

    def has_room(self) -> bool:
        """Whether a new connection of any client fits without making room."""
        return self._total < MAX_CONNECTIONS and self._most < MAX_PER_CLIENT

    def to_close(self, client: str, state: Callable[[Connection], int]) -> Connection | None:
        """The connection to close so that a new one of ``client`` may open (``state(connection)`` says what a
        connection is doing); None: refuse the new one."""
        mine = self.count(client) + 1
        if mine <= MAX_PER_CLIENT and self._most > mine:
            most = max(self._by_client, key=self.count)
            return min(self._by_client[most], key=state)  # the oldest of the first state in STATES
        own = self._by_client.get(client, {})
        if own:
            victim = min(own, key=state)
            if state(victim) <= WAITING_SERVED:
                return victim
        if mine > MAX_PER_CLIENT:
            return None  # the newcomer's address has no idle connection: the newcomer is the one it loses
        # No address holds more than the newcomer's will: the idle connection of those holding as many that has been
        # idle the longest (the first found: busy ones are few).
        for connection, of in self._opened.items():
            if of != client and state(connection) <= WAITING_SERVED and self.count(of) >= mine:
                return connection
        return None
