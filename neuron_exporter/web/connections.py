"""The endpoint's connections: accept them, read request heads, hand each request to the application in its lane
(``lanes``) and write its response, optionally over TLS; each connection's socket and state are a ``connection``.
Nothing here knows a path, a metric or a user.

The endpoint runs inside training processes too, so no client may make it cost the training job much:

- One thread waits on every open connection (a selector): it reads request heads and writes responses without ever
  blocking. A client that connects and stalls, trickles bytes or does not read what it asked for costs a socket
  until its deadline, never a thread. An address holds at most ``MAX_PER_CLIENT`` connections and all together at
  most ``MAX_CONNECTIONS``: past either, the address with the most loses one of its own (``admission``).
- A connection has one request at a time in the server: its next one, pipelined or not, is taken only once the
  response to this one is written (a client that does not read gets nothing more done), and it then queues behind
  the requests of every other connection waiting in its lane. Bytes past the request being answered wait in the
  socket, unread.
- Each lane has its own workers; an application that answers later (a ``Future``, e.g. a render shared by many
  requests) frees its worker at once.
- A client refused (4xx) faster than ``REFUSAL_REFILL_SECONDS`` allows, past a burst, is not read until it may be
  refused again: its flood costs an accept per connection.
- Accepts that make room (close a connection, or refuse the newcomer) come at most ``ROOM_PER_SECOND`` a second,
  past a burst: a crowd that opens a connection again as soon as it loses one would otherwise have the server
  accept and close thousands a second, each taking the interpreter lock from the training thread. Meanwhile new
  connections wait in the kernel's accept queue, taken in the order they came, so a scraper's turn still comes.
  An accept takes the room of peers that closed before it makes any, and accepts wait for no pace once any
  client's connection fits again: a flood that has gone costs the next scraper nothing.

No request log on stderr.
"""

from __future__ import annotations

import logging
import queue
import selectors
import socket
import ssl
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future

from .admission import BUSY, PAUSED, WAITING, WRITING, Admission
from .connection import CLOSED, Connection
from .http_messages import HEAD_END, MAX_HEAD_BYTES, TOO_LARGE, Request, Response, keeps_alive, parse_request, serialize
from .lanes import Lanes
from .rate_limit import Pacer, TokenBuckets, client_key

log = logging.getLogger(__name__)

LISTEN_BACKLOG = 128
WORKERS = 8  # threads answering requests, all lanes together; each is one more thread in a training process
HEAD_TIMEOUT_SECONDS = 5.0  # TLS handshake, request line and headers, all together; not per read
IDLE_TIMEOUT_SECONDS = 90.0  # a kept-alive connection between requests (above the usual 60 s scrape interval)
WRITE_TIMEOUT_SECONDS = 10.0  # the whole response (Prometheus' default scrape timeout)
# Refused requests (4xx) per client: past the burst, its connections are not read until it has a token again.
REFUSALS_BURST, REFUSAL_REFILL_SECONDS = 20, 0.5
# Accepts that make room: a scraper behind a full accept queue (LISTEN_BACKLOG) waits at most about 1.3 s.
ROOM_PER_SECOND, ROOM_BURST = 100, 64

Answer = Response | Future  # a Future gives the Response later


class Connections:
    """Serves HTTP/1.1 on ``listener`` from daemon threads: ``app`` answers every request, now or with a Future (if
    it raises, or the Future does, the connection is closed), in the lane ``lane_of(request)`` picks, lane ``n``
    having ``lanes[n]`` workers; ``tls()``, asked before each burst of accepts, gives the TLS context of the
    connections accepted then (None: plain TCP)."""

    def __init__(
        self,
        app: Callable[[Request], Answer],
        listener: socket.socket,
        tls: Callable[[], ssl.SSLContext | None],
        lanes: Sequence[int] = (WORKERS,),
        lane_of: Callable[[Request], int] = lambda request: 0,
    ):
        self._app = app
        self._tls = tls
        self._lane_of = lane_of
        self._listener = listener
        self._listener.setblocking(False)
        self._refusals = TokenBuckets(REFUSALS_BURST, REFUSAL_REFILL_SECONDS)
        self._room = Pacer(ROOM_PER_SECOND, ROOM_BURST)
        self._accepting_from = 0.0  # while accepts that make room wait for their pace: when they may go on
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._selector = selectors.DefaultSelector()
        self._wake_reader, self._wake_writer = socket.socketpair()
        self._wake_reader.setblocking(False)
        self._wake_writer.setblocking(False)
        # The open connections, by client address; only the loop thread changes them.
        self._admission: Admission[Connection] = Admission()
        self._answered: queue.SimpleQueue[tuple[Connection, list[bytes] | None, bool]] = queue.SimpleQueue()
        self._lanes: Lanes[Connection] = Lanes(self._work, lanes, "neuron-exporter-http-worker")
        self._next_sweep = 0.0
        self._logged: set[str] = set()

    def start(self) -> None:
        if self._thread is None:
            self._selector.register(self._listener, selectors.EVENT_READ, None)
            self._selector.register(self._wake_reader, selectors.EVENT_READ, _WAKE)
            self._thread = threading.Thread(target=self._loop, name="neuron-exporter-http", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop serving and close every connection, kept-alive ones too: a stopped server must not answer a
        scraper that keeps its socket. Returns without waiting for a response in progress."""
        if self._thread is not None:
            self._stopping = True
            self._wake()
            self._thread.join()
            self._thread = None
        self._lanes.stop()
        for connection in list(self._admission):
            self._close(connection)  # workers never use a socket: only this thread reads and writes
        for closeable in (self._selector, self._listener, self._wake_reader, self._wake_writer):
            closeable.close()

    def close_inherited(self) -> None:
        """In a child made by fork: close this copy of the listening socket and of the connections. The threads
        exist only in the parent, which keeps serving; ``stop()`` would wait for them forever here."""
        self._thread = None
        for connection in list(self._admission):
            if connection.sock is not None:
                connection.sock.close()  # close, never shutdown: the parent still uses these connections
        for closeable in (self._listener, self._selector, self._wake_reader, self._wake_writer):
            closeable.close()

    # -- the loop thread: accept, read request heads, write responses ---------------------------------------------
    def _loop(self) -> None:
        while not self._stopping:
            try:
                timeout = 0.25
                if self._accepting_from:
                    timeout = min(timeout, max(0.0, self._accepting_from - time.monotonic()))
                if self._serve(self._selector.select(timeout=timeout)):
                    self._accept()
                now = time.monotonic()
                # Once anyone's connection fits again (a flood has gone), accepts need no pace: they make no room.
                if self._accepting_from and (now >= self._accepting_from or self._admission.has_room()):
                    self._accepting_from = 0.0
                    self._selector.register(self._listener, selectors.EVENT_READ, None)
                if now >= self._next_sweep:
                    self._next_sweep = now + 0.25
                    self._sweep(now)
            except Exception as error:  # the endpoint must outlive any one connection
                self._log_once(f"HTTP server loop: {type(error).__name__}: {error}")
                log.debug("HTTP server loop", exc_info=True)

    def _serve(self, events: list[tuple[selectors.SelectorKey, int]]) -> bool:
        """Read and write what ``events`` say the connections are ready for; whether the listener has connections to
        accept (after the others: peers that closed free their room first)."""
        listener_ready = False
        for key, _events in events:
            if key.data is None:
                listener_ready = True
            elif key.data is _WAKE:
                self._take_answers()
            elif key.data.state == WAITING:  # not closed by an earlier event of this round
                self._read(key.data)
            elif key.data.state == WRITING:
                self._write(key.data)
        return listener_ready

    def _sweep(self, now: float) -> None:
        for connection in list(self._admission):
            if connection.state == WAITING and connection.deadline <= now:
                self._close(connection)  # a head that never came
            elif connection.state == WRITING and connection.deadline <= now:
                self._close(connection, reset=True)  # a response the client does not read: drop what the kernel holds
            elif connection.state == PAUSED and connection.paused_until <= now:
                wait = self._refusals.seconds_until_token(connection.client)
                if wait:  # its other connections took the token
                    connection.paused_until = now + wait
                    continue
                connection.paused_until = 0.0
                self._take_request(connection, idle=HEAD_TIMEOUT_SECONDS)  # a refused client gets no long idle time

    def _accept(self) -> None:
        tls = self._tls()
        for _ in range(64):  # a burst, without starving the connections already open
            if self._accepting_from:
                return
            try:
                sock, address = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as error:  # e.g. out of file descriptors: the listener stays readable, so pause
                self._log_once(f"cannot accept connections: {error.strerror or error}")
                time.sleep(0.05)
                return
            client = client_key(address[0])
            if self._admission.full_for(client):
                self._serve(self._selector.select(0))  # peers that closed since this round began free their room
            if self._admission.full_for(client):
                self._pace_room()
                victim = self._admission.to_close(client, Connection.rank)
                if victim is None:
                    sock.close()
                    continue
                self._close(victim, reset=victim.state == WRITING)
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            connection = Connection(sock, client, time.monotonic() + HEAD_TIMEOUT_SECONDS)
            if tls is not None:
                try:
                    connection.sock = sock = tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
                except (OSError, ValueError):
                    sock.close()
                    continue
                connection.handshaking = True
            self._admission.add(client, connection)
            wait = self._refusals.seconds_until_token(connection.client)
            if wait:  # costs this accept and a socket; nothing is read (nor a TLS handshake made) until then
                connection.paused_until = time.monotonic() + wait
                connection.state = PAUSED
                continue
            self._watch(connection, selectors.EVENT_READ)

    def _pace_room(self) -> None:
        """An accept made room: if that was faster than ``ROOM_PER_SECOND``, stop accepting until it is not."""
        wait = self._room.reserve()
        if wait:  # meanwhile new connections wait in the kernel's accept queue, costing this process nothing
            self._accepting_from = time.monotonic() + wait
            self._selector.unregister(self._listener)

    def _read(self, connection: Connection) -> None:
        try:
            data = connection.receive()
        except (OSError, ValueError) as error:
            log.debug("connection from %s: %s", connection.client, error)
            self._close(connection)
            return
        if isinstance(data, int):
            self._watch(connection, data)
            return
        if not data:
            self._close(connection)
            return
        self._watch(connection, selectors.EVENT_READ)  # no longer for a handshake that wanted to write
        if not connection.buffer:  # the first byte of a request: its head must follow soon
            connection.deadline = min(connection.deadline, time.monotonic() + HEAD_TIMEOUT_SECONDS)
        scanned, connection.buffer = len(connection.buffer) - 3, connection.buffer + data  # look at what came only
        if len(connection.buffer) > MAX_HEAD_BYTES or HEAD_END.search(connection.buffer, scanned):
            self._watch(connection, 0)
            self._take_request(connection)

    def _take_request(self, connection: Connection, idle: float | None = None) -> None:
        """The connection's next request to its lane if its buffer holds one, else wait for it (``idle`` seconds,
        by default ``IDLE_TIMEOUT_SECONDS``, if none has begun)."""
        end = HEAD_END.search(connection.buffer)
        if end is None and len(connection.buffer) <= MAX_HEAD_BYTES:
            connection.deadline = time.monotonic() + (
                HEAD_TIMEOUT_SECONDS if connection.buffer else idle or IDLE_TIMEOUT_SECONDS
            )
            connection.state = WAITING
            self._admission.touch(connection)
            self._watch(connection, selectors.EVENT_READ)
            return
        if end is None or end.start() > MAX_HEAD_BYTES:
            self._start_writing(connection, self._serialized(connection, "GET", TOO_LARGE, False), False)
            return
        head = bytes(connection.buffer[: end.start()])
        del connection.buffer[: end.end()]
        request = parse_request(head, connection.client)
        if isinstance(request, Response):  # refused for its form: answered here, then closed
            self._start_writing(connection, self._serialized(connection, "GET", request, False), False)
            return
        connection.request = request
        connection.state = BUSY
        try:
            lane = self._lane_of(request)
        except Exception:  # noqa: BLE001 - the application's; as if it failed to answer
            self._answered.put((connection, None, False))
            self._wake()
            return
        self._lanes.put(lane, connection.client, connection)

    def _take_answers(self) -> None:
        try:
            while self._wake_reader.recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass
        while not self._answered.empty():
            connection, parts, keep_alive = self._answered.get()
            if connection.state == CLOSED:  # closed meanwhile (stop)
                continue
            if parts is None or self._stopping:
                self._close(connection)
            else:
                self._start_writing(connection, parts, keep_alive)

    def _start_writing(self, connection: Connection, parts: list[bytes], keep_alive: bool) -> None:
        connection.output = deque(memoryview(part) for part in parts)
        connection.keep_alive = keep_alive
        connection.deadline = time.monotonic() + WRITE_TIMEOUT_SECONDS
        connection.state = WRITING
        self._write(connection)

    def _write(self, connection: Connection) -> None:
        try:
            events = connection.send()
        except (OSError, ValueError) as error:
            log.debug("connection from %s: %s", connection.client, error)
            self._close(connection)
            return
        if events:
            self._watch(connection, events)
            return
        self._watch(connection, 0)
        connection.output = None
        if not connection.keep_alive:
            self._close(connection)
        elif connection.paused_until:  # out of the selector: nothing it sends is read until then
            connection.state = PAUSED
        else:
            self._take_request(connection)

    def _watch(self, connection: Connection, events: int) -> None:
        """Have the selector watch the connection for ``events`` (0: not at all)."""
        sock = connection.sock
        assert sock is not None
        if events == connection.events:
            return
        if not connection.events:
            self._selector.register(sock, events, connection)
        elif not events:
            self._selector.unregister(sock)
        else:
            self._selector.modify(sock, events, connection)
        connection.events = events

    def _close(self, connection: Connection, reset: bool = False) -> None:
        assert connection.sock is not None  # closed once only
        if connection.events:
            self._selector.unregister(connection.sock)
            connection.events = 0
        if reset:  # a reset, not a FIN after the unsent bytes: the kernel keeps none of them
            connection.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        connection.sock.close()
        connection.sock = None
        connection.state = CLOSED
        self._admission.remove(connection.client, connection)

    def _wake(self) -> None:
        try:
            self._wake_writer.send(b"\0")
        except OSError:  # full: the loop has wake-ups pending anyway
            pass

    # -- workers, and whoever completes a Future: answer a request, hand the response to the loop -----------------
    def _work(self, connection: Connection) -> None:
        request = connection.request
        if connection.sock is None or request is None:  # closed while it waited for a worker, to make room
            return
        try:
            answer = self._app(request)
        except Exception as error:  # noqa: BLE001 - a failing request closes its connection, not the server
            log.debug("connection from %s: %s: %s", connection.client, type(error).__name__, error)
            self._answer(connection, request, None)
            return
        if isinstance(answer, Future):
            answer.add_done_callback(lambda done: self._answer(connection, request, done))
        else:
            self._answer(connection, request, answer)

    def _answer(self, connection: Connection, request: Request, answer: Response | Future | None) -> None:
        parts, keep_alive = None, False
        try:
            response = answer.result() if isinstance(answer, Future) else answer
            if response is not None:
                keep_alive = keeps_alive(request)
                parts = self._serialized(connection, request.method, response, keep_alive)
        except Exception as error:  # noqa: BLE001 - as above
            log.debug("connection from %s: %s: %s", connection.client, type(error).__name__, error)
        self._answered.put((connection, parts, keep_alive))
        self._wake()

    def _serialized(self, connection: Connection, method: str, response: Response, keep_alive: bool) -> list[bytes]:
        # The refusal is counted before it is sent: a client that reconnects the moment it reads it must find it
        # counted already.
        if 400 <= response.status < 500 and not self._refusals.take(connection.client):
            # A client refused as fast as it asks (guessing passwords, say) would cost the process a request each
            # time: its next request waits, unread, where closing would make it reconnect (a TLS handshake each).
            connection.paused_until = time.monotonic() + self._refusals.seconds_until_token(connection.client)
        connection.served = connection.served or 200 <= response.status < 300
        return serialize(method, response, keep_alive)

    def _log_once(self, message: str) -> None:
        if message not in self._logged and len(self._logged) < 100:
            self._logged.add(message)
            log.warning("%s", message)


_WAKE = object()


def bind_listener(addr: str, port: int) -> socket.socket:
    """A listening TCP socket on ``addr``:``port`` (0: a free port); ``OSError`` if the port is taken."""
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    try:
        # Only skips TIME_WAIT; a port with a live listener still fails to bind.
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((addr, port))
        listener.listen(LISTEN_BACKLOG)
    except OSError:
        listener.close()
        raise
    return listener
