"""The endpoint's connections: accept them, read request heads, hand each request to the application and send its
response, optionally over TLS. Nothing here knows a path, a metric or a user.

The endpoint runs inside training processes too, so no client may make it cost the training job much. One thread
waits on every open connection (a selector) and reads request heads: a client that connects and stalls, or trickles
bytes, costs a socket until its deadline, never a thread; past ``MAX_CONNECTIONS``, one that waits is closed (see
``_connection_to_close``). At most ``WORKERS`` threads answer complete requests. A client refused (4xx) faster than
``REFUSAL_REFILL_SECONDS`` allows, past a burst, is not read until it may be refused again: its flood costs an
accept per connection. No request log on stderr.
"""

from __future__ import annotations

import itertools
import logging
import queue
import re
import selectors
import socket
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from email.utils import formatdate
from http import HTTPStatus
from typing import NamedTuple

from .rate_limit import TokenBuckets, client_key

log = logging.getLogger(__name__)

TEXT = "text/plain; charset=utf-8"
LISTEN_BACKLOG = 128
WORKERS = 8  # scrapers are few; each worker is one more thread in the training process
MAX_CONNECTIONS = 256  # open sockets, waiting or being answered; in a training process they share its file limit
HEAD_TIMEOUT_SECONDS = 5.0  # TLS handshake, request line and headers, all together; not per read
IDLE_TIMEOUT_SECONDS = 90.0  # a kept-alive connection between requests (above the usual 60 s scrape interval)
WRITE_TIMEOUT_SECONDS = 10.0  # the whole response (Prometheus' default scrape timeout)
# Refused requests (4xx) per client: past the burst, its connections are not read until it has a token again.
REFUSALS_BURST, REFUSAL_REFILL_SECONDS = 20, 0.5
MAX_HEAD_BYTES = 16384
MAX_HEADERS = 100
HEAD_END = re.compile(rb"\r?\n\r?\n")


class Request(NamedTuple):
    method: str
    target: str
    version: str
    headers: dict[str, str]  # names in lower case
    client: str  # its key for rate limits: the address, or its /64 for IPv6


class Response(NamedTuple):
    status: int
    body: bytes  # sent for GET; for HEAD only its length is
    content_type: str
    headers: Mapping[str, str] = {}


TOO_LARGE = Response(431, b"Request Header Fields Too Large\n", TEXT)
BAD_REQUEST = Response(400, b"Bad Request\n", TEXT)


class Connections:
    """Serves HTTP/1.1 on ``listener`` from daemon threads: ``app`` answers every request (if it raises, the
    connection is closed), and ``tls()``, asked before each burst of accepts, gives the TLS context of the
    connections accepted then (None: plain TCP)."""

    def __init__(
        self,
        app: Callable[[Request], Response],
        listener: socket.socket,
        tls: Callable[[], ssl.SSLContext | None],
    ):
        self._app = app
        self._tls = tls
        self._listener = listener
        self._listener.setblocking(False)
        self._refusals = TokenBuckets(REFUSALS_BURST, REFUSAL_REFILL_SECONDS)
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._selector = selectors.DefaultSelector()
        self._wake_reader, self._wake_writer = socket.socketpair()
        self._wake_reader.setblocking(False)
        self._wake_writer.setblocking(False)
        # Connections, each in one place; only the loop thread changes them.
        self._waiting: dict[_Connection, None] = {}  # in the selector, oldest first
        self._paused: dict[_Connection, None] = {}  # of clients refused too often: out of the selector for now
        self._busy: set[_Connection] = set()  # handed to workers
        self._returned: queue.SimpleQueue[_Connection] = queue.SimpleQueue()  # from workers back to the loop
        self._jobs: queue.SimpleQueue[_Connection | None] = queue.SimpleQueue()
        self._workers: list[threading.Thread] = []
        self._idle_workers = 0
        self._workers_lock = threading.Lock()
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
        for connection in list(self._busy):
            sock = connection.sock  # None if its worker closed it already
            try:
                if sock is not None:
                    sock.shutdown(socket.SHUT_RDWR)  # the worker answering it fails and closes it
            except OSError:
                pass
        for _ in self._workers:
            self._jobs.put(None)
        for connection in [*self._waiting, *self._paused]:
            self._close(connection)
        while not self._returned.empty():
            connection = self._returned.get()
            if connection.sock is not None:
                connection.sock.close()
        for closeable in (self._selector, self._listener, self._wake_reader, self._wake_writer):
            closeable.close()

    def close_inherited(self) -> None:
        """In a child made by fork: close this copy of the listening socket and of the connections. The threads
        exist only in the parent, which keeps serving; ``stop()`` would wait for them forever here."""
        self._thread = None
        for connection in [*self._waiting, *self._paused, *self._busy]:
            if connection.sock is not None:
                connection.sock.close()  # close, never shutdown: the parent still uses these connections
        for closeable in (self._listener, self._selector, self._wake_reader, self._wake_writer):
            closeable.close()

    # -- the loop thread: accept, read request heads, hand complete ones to workers -----------------------------
    def _loop(self) -> None:
        while not self._stopping:
            try:
                for key, _events in self._selector.select(timeout=0.25):
                    if key.data is None:
                        self._accept()
                    elif key.data is _WAKE:
                        self._take_back()
                    elif key.data in self._waiting:  # not closed by an earlier event of this round
                        self._read(key.data)
                now = time.monotonic()
                if now >= self._next_sweep:
                    self._next_sweep = now + 0.25
                    self._sweep(now)
            except Exception as error:  # the endpoint must outlive any one connection
                self._log_once(f"HTTP server loop: {type(error).__name__}: {error}")
                log.debug("HTTP server loop", exc_info=True)

    def _sweep(self, now: float) -> None:
        for connection in [c for c in self._waiting if c.deadline <= now]:
            self._close(connection)
        for connection in [c for c in self._paused if c.paused_until <= now]:
            wait = self._refusals.seconds_until_token(connection.client)
            if wait:  # its other connections took the token
                connection.paused_until = now + wait
                continue
            del self._paused[connection]
            connection.paused_until = 0.0
            connection.deadline = now + HEAD_TIMEOUT_SECONDS  # a refused client gets no long idle time
            self._waiting[connection] = None
            if HEAD_END.search(connection.buffer):  # it sent its next request during the pause
                self._hand_over(connection)
            else:
                assert connection.sock is not None  # open until _close() takes it out of _paused
                self._selector.register(connection.sock, selectors.EVENT_READ, connection)

    def _accept(self) -> None:
        tls = self._tls()
        for _ in range(64):  # a burst, without starving the connections already open
            try:
                sock, address = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as error:  # e.g. out of file descriptors: the listener stays readable, so pause
                self._log_once(f"cannot accept connections: {error.strerror or error}")
                time.sleep(0.05)
                return
            if len(self._waiting) + len(self._paused) + len(self._busy) >= MAX_CONNECTIONS:
                victim = self._connection_to_close()
                if victim is None:
                    sock.close()
                    continue
                self._close(victim)
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            connection = _Connection(sock, client_key(address[0]), time.monotonic() + HEAD_TIMEOUT_SECONDS)
            if tls is not None:
                try:
                    connection.sock = sock = tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
                except (OSError, ValueError):
                    sock.close()
                    continue
                connection.handshaking = True
            wait = self._refusals.seconds_until_token(connection.client)
            if wait:  # costs this accept and a socket; nothing is read (nor a TLS handshake made) until then
                connection.paused_until = time.monotonic() + wait
                self._paused[connection] = None
                continue
            self._waiting[connection] = None
            self._selector.register(sock, selectors.EVENT_READ, connection)

    def _connection_to_close(self) -> _Connection | None:
        """To make room: a paused one (its client was refused too often), else the one that has waited longest,
        sparing a kept-alive connection that was served (a scraper that proved itself) if one of the next is not."""
        if self._paused:
            return next(iter(self._paused))
        for connection in itertools.islice(self._waiting, 16):
            if not connection.served:
                return connection
        return next(iter(self._waiting), None)

    def _read(self, connection: _Connection) -> None:
        sock = connection.sock
        assert sock is not None  # open while in the selector
        try:
            if connection.handshaking:
                assert isinstance(sock, ssl.SSLSocket)
                sock.do_handshake()
                connection.handshaking = False
                self._selector.modify(sock, selectors.EVENT_READ, connection)
            data = sock.recv(65536)
            while data and isinstance(sock, ssl.SSLSocket) and sock.pending():
                data += sock.recv(sock.pending())  # decrypted already: select() will not say so
        except (ssl.SSLWantReadError, BlockingIOError, InterruptedError):
            return
        except ssl.SSLWantWriteError:  # the handshake's reply did not fit in the socket's buffer
            self._selector.modify(sock, selectors.EVENT_READ | selectors.EVENT_WRITE, connection)
            return
        except (OSError, ValueError) as error:
            log.debug("connection from %s: %s", connection.client, error)
            self._close(connection)
            return
        if not data:
            self._close(connection)
            return
        if not connection.buffer:  # the first byte of a request: its head must follow soon
            connection.deadline = min(connection.deadline, time.monotonic() + HEAD_TIMEOUT_SECONDS)
        connection.buffer += data
        if len(connection.buffer) > MAX_HEAD_BYTES or HEAD_END.search(connection.buffer):
            self._selector.unregister(sock)
            self._hand_over(connection)

    def _hand_over(self, connection: _Connection) -> None:
        del self._waiting[connection]
        self._busy.add(connection)
        self._dispatch(connection)

    def _take_back(self) -> None:
        try:
            while self._wake_reader.recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass
        while not self._returned.empty():
            connection = self._returned.get()
            self._busy.discard(connection)
            if connection.sock is None:
                continue
            if self._stopping:
                connection.sock.close()
                continue
            connection.sock.setblocking(False)
            if connection.paused_until:  # out of the selector: nothing it sends is read until then
                self._paused[connection] = None
                continue
            self._waiting[connection] = None
            partial = HEAD_TIMEOUT_SECONDS if connection.buffer else IDLE_TIMEOUT_SECONDS
            connection.deadline = time.monotonic() + partial
            self._selector.register(connection.sock, selectors.EVENT_READ, connection)

    def _close(self, connection: _Connection) -> None:
        self._waiting.pop(connection, None)
        self._paused.pop(connection, None)
        assert connection.sock is not None  # closed once only
        try:
            self._selector.unregister(connection.sock)
        except (KeyError, ValueError):
            pass
        connection.sock.close()
        connection.sock = None

    def _wake(self) -> None:
        try:
            self._wake_writer.send(b"\0")
        except OSError:  # full: the loop has wake-ups pending anyway
            pass

    # -- workers: answer the requests of one connection, then give it back to the loop --------------------------
    def _dispatch(self, connection: _Connection) -> None:
        self._jobs.put(connection)
        with self._workers_lock:
            if self._idle_workers == 0 and len(self._workers) < WORKERS:
                worker = threading.Thread(target=self._work, name="neuron-exporter-http-worker", daemon=True)
                self._workers.append(worker)
                self._idle_workers += 1
                worker.start()

    def _work(self) -> None:
        while True:
            connection = self._jobs.get()
            with self._workers_lock:
                self._idle_workers -= 1
            if connection is None:
                return
            keep_alive = False
            try:
                keep_alive = self._answer_all(connection)
            except Exception as error:  # noqa: BLE001 - a broken connection must not end the worker
                log.debug("connection from %s: %s: %s", connection.client, type(error).__name__, error)
            if (not keep_alive or self._stopping) and connection.sock is not None:
                connection.sock.close()
                connection.sock = None
            with self._workers_lock:
                self._idle_workers += 1
            self._returned.put(connection)
            self._wake()

    def _answer_all(self, connection: _Connection) -> bool:
        """Answer every complete request in the connection's buffer; True if the connection stays open."""
        while True:
            end = HEAD_END.search(connection.buffer)
            if end is None or end.start() > MAX_HEAD_BYTES:
                if len(connection.buffer) <= MAX_HEAD_BYTES:
                    return True  # part of the next request: back to the loop
                self._send(connection, "GET", TOO_LARGE, False)
                return False
            head = bytes(connection.buffer[: end.start()])
            del connection.buffer[: end.end()]
            if not self._answer(connection, head):
                return False
            if connection.paused_until:
                return True

    def _answer(self, connection: _Connection, head: bytes) -> bool:
        if head.count(b"\n") > MAX_HEADERS:
            self._send(connection, "GET", TOO_LARGE, False)
            return False
        request = _parse_head(head, connection.client)
        if request is None:
            self._send(connection, "GET", BAD_REQUEST, False)
            return False
        response = self._app(request)
        # Request bodies are never read: after one, the connection cannot be reused.
        headers = request.headers
        keep_alive = (
            request.version == "HTTP/1.1"
            and headers.get("connection", "").lower() != "close"
            and headers.get("content-length", "0") == "0"
            and "transfer-encoding" not in headers
        )
        self._send(connection, request.method, response, keep_alive)
        return keep_alive

    def _send(self, connection: _Connection, method: str, response: Response, keep_alive: bool) -> None:
        status, body = response.status, response.body
        lines = [
            f"HTTP/1.1 {status} {HTTPStatus(status).phrase}",
            "Server: neuron-exporter",
            f"Date: {formatdate(usegmt=True)}",
            f"Content-Type: {response.content_type}",
            f"Content-Length: {len(body)}",
            *(f"{name}: {value}" for name, value in response.headers.items()),
        ]
        if not keep_alive:
            lines.append("Connection: close")
        data = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (b"" if method == "HEAD" else body)
        # The refusal is counted before it is sent: a client that reconnects the moment it reads it must find it
        # counted already.
        if 400 <= status < 500 and not self._refusals.take(connection.client):
            # A client refused as fast as it asks (guessing passwords, say) would cost the process a request each
            # time: its next request waits, unread, where closing would make it reconnect (a TLS handshake each).
            connection.paused_until = time.monotonic() + self._refusals.seconds_until_token(connection.client)
        assert connection.sock is not None  # open until the worker that sends this closes it
        _send_all(connection.sock, data, time.monotonic() + WRITE_TIMEOUT_SECONDS)
        connection.served = connection.served or 200 <= status < 300

    def _log_once(self, message: str) -> None:
        if message not in self._logged and len(self._logged) < 100:
            self._logged.add(message)
            log.warning("%s", message)


_WAKE = object()


class _Connection:
    __slots__ = ("sock", "client", "deadline", "handshaking", "buffer", "paused_until", "served")

    def __init__(self, sock: socket.socket, client: str, deadline: float):
        self.sock: socket.socket | None = sock
        self.client = client  # its key for rate limits: the address, or its /64 for IPv6
        self.deadline = deadline  # monotonic time after which a connection still waiting is closed
        self.handshaking = False
        self.buffer = bytearray()  # received and not yet answered
        self.paused_until = 0.0  # while its client is refused too often: monotonic time until it is read again
        self.served = False  # a request of it got a 2xx answer


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


def _parse_head(head: bytes, client: str) -> Request | None:
    """The request of a head (header names in lower case); None if malformed."""
    lines = head.decode("latin-1").split("\n")
    parts = lines[0].rstrip("\r").split(" ")
    if len(parts) != 3 or not parts[0] or not parts[2].startswith("HTTP/1."):
        return None
    headers = {}
    for line in lines[1:]:
        name, colon, value = line.rstrip("\r").partition(":")
        if not colon or not name or name != name.strip():
            return None
        headers[name.lower()] = value.strip()
    return Request(parts[0], parts[1], parts[2], headers, client)


def _send_all(sock: socket.socket, data: bytes, deadline: float) -> None:
    """Send everything before ``deadline``: a client that reads slowly cannot hold a worker for longer."""
    view = memoryview(data)
    while view:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("the client did not read the response in time")
        sock.settimeout(remaining)
        view = view[sock.send(view) :]
