"""The HTTP endpoint: ``/metrics``, the probes' ``/-/healthy`` and ``/-/ready`` and a small landing page, optionally
behind TLS and basic auth. ``GET`` and ``HEAD``; any other method is 405.

Used both by ``attach()`` inside a training process and by the node daemon, so no client may make it cost the
training job much. One thread waits on every open connection (a selector) and reads request heads: a client that
connects and stalls, or trickles bytes, costs a socket until its deadline, never a thread; past
``MAX_CONNECTIONS``, one that waits is closed (see ``_connection_to_close``). At most ``WORKERS`` threads answer
complete requests. A client refused (4xx) faster than ``REFUSAL_REFILL_SECONDS`` allows, past a burst, is not read
until it may be refused again: its flood costs an accept per connection. Renders (``/metrics``, pages) are shared by
the requests that wait for them and paced for all clients together (``shared_render``: ``RENDERS_PER_SECOND`` past
``RENDERS_BURST``). It serves nothing else: no file paths, no
environment, no request log on stderr.
"""

from __future__ import annotations

import html
import itertools
import logging
import queue
import re
import selectors
import socket
import ssl
import threading
import time
from collections.abc import Callable
from email.utils import formatdate
from http import HTTPStatus
from os import PathLike
from typing import Any
from urllib.parse import parse_qs, urlsplit

from prometheus_client.exposition import choose_encoder, gzip_accepted

from .. import __version__
from .basic_auth import CLIENT_REFILL_SECONDS, LIMITED, OK, BasicAuth
from .rate_limit import Pacer, TokenBuckets, client_key
from .shared_render import SharedRender
from .web_config import WebConfig, WebConfigReloader, load_web_config

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
TEXT = "text/plain; charset=utf-8"
LISTEN_BACKLOG = 128
WORKERS = 8  # scrapers are few; each worker is one more thread in the training process
MAX_CONNECTIONS = 256  # open sockets, waiting or being answered; in a training process they share its file limit
HEAD_TIMEOUT_SECONDS = 5.0  # TLS handshake, request line and headers, all together; not per read
IDLE_TIMEOUT_SECONDS = 90.0  # a kept-alive connection between requests (above the usual 60 s scrape interval)
WRITE_TIMEOUT_SECONDS = 10.0  # the whole response (Prometheus' default scrape timeout)
# Refused requests (4xx) per client: past the burst, its connections are not read until it has a token again.
REFUSALS_BURST, REFUSAL_REFILL_SECONDS = 20, 0.5
# Renders of /metrics and pages, for all clients together: a render costs the process CPU (a training process its
# GIL), so past a burst they are paced, and the requests that wait share the next one. Prometheus scrapes every 15 to
# 60 s; a few servers and people stay far below this.
RENDERS_PER_SECOND, RENDERS_BURST = 2.0, 10
MAX_HEAD_BYTES = 16384
MAX_HEADERS = 100
HEAD_END = re.compile(rb"\r?\n\r?\n")
HEALTH = {"/-/healthy": b"neuron-exporter is Healthy.\n", "/-/ready": b"neuron-exporter is Ready.\n"}

LANDING_PAGE = """<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>neuron-exporter</title></head>
<body><h1>neuron-exporter</h1>
<p>Prometheus metrics for PyTorch/XLA training.</p>
<p><a href="/metrics">/metrics</a></p>
<p><a href="/diagnosis">/diagnosis</a>: where graphs are cut and recompiled, and what to fix first</p>
<p>version {version}</p>
</body></html>
"""


class MetricsServer:
    """Serves ``source`` at ``/metrics`` from daemon threads.

    ``source`` is a registry (anything with ``collect()``), served in the format the scraper asks for (OpenMetrics
    or text 0.0.4, as prometheus_client chooses from the Accept header), or a function that returns text format
    0.0.4 (the node view, which merges the ranks' text expositions): always served as text.

    The socket is bound in ``__init__`` (``OSError`` if the port is taken; ``port=0`` picks a free one), so a
    caller knows at once whether it holds the port. ``web_config`` is a ``WebConfig`` or the path of a web config
    file (same format as Prometheus exporters' ``--web.config.file``); its files are re-read when they change.
    """

    def __init__(
        self,
        source: Callable[[], bytes] | object,
        addr: str = "0.0.0.0",
        port: int = 19478,
        web_config: WebConfig | str | PathLike | None = None,
        pages: dict[str, Callable[[dict[str, list[str]]], tuple[bytes, str]]] | None = None,
        listener: socket.socket | None = None,
    ):
        if isinstance(web_config, (str, PathLike)):
            web_config = load_web_config(web_config)
        self._source: Any = source  # a collector (it has collect()) or a function that renders the exposition
        self._pages = dict(pages or {})  # path -> page(query parameters) -> (body, content type)
        self._configs = WebConfigReloader(web_config)
        self._config = web_config
        self._auth = BasicAuth()
        self._refusals = TokenBuckets(REFUSALS_BURST, REFUSAL_REFILL_SECONDS)
        self._renders = SharedRender(Pacer(RENDERS_PER_SECOND, RENDERS_BURST))
        self._listener = listener if listener is not None else bind_listener(addr, port)
        self._listener.setblocking(False)
        self.addr = addr
        self.port: int = self._listener.getsockname()[1]
        self.url = url_of(self._listener, addr, web_config is not None and bool(web_config.tls))
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

    @property
    def web_config(self) -> WebConfig | None:
        return self._config

    def start(self) -> MetricsServer:
        if self._thread is None:
            self._selector.register(self._listener, selectors.EVENT_READ, None)
            self._selector.register(self._wake_reader, selectors.EVENT_READ, _WAKE)
            self._thread = threading.Thread(target=self._loop, name="neuron-exporter-http", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close every connection, kept-alive ones too: a stopped server must not answer a
        scraper that keeps its socket. Returns without waiting for a render in progress."""
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

    def close_inherited_socket(self) -> None:
        """In a child made by fork: close this copy of the listening socket and of the connections. The threads
        exist only in the parent, which keeps serving; ``stop()`` would wait for them forever here."""
        self._thread = None
        for connection in [*self._waiting, *self._paused, *self._busy]:
            if connection.sock is not None:
                connection.sock.close()  # close, never shutdown: the parent still uses these connections
        for closeable in (self._listener, self._selector, self._wake_reader, self._wake_writer):
            closeable.close()

    def __enter__(self) -> MetricsServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

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
        self._config = self._configs.current()
        tls = self._config.ssl_context if self._config is not None else None
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
                self._send(connection, "GET", 431, b"Request Header Fields Too Large\n", TEXT, {}, False)
                return False
            head = bytes(connection.buffer[: end.start()])
            del connection.buffer[: end.end()]
            if not self._answer(connection, head):
                return False
            if connection.paused_until:
                return True

    def _answer(self, connection: _Connection, head: bytes) -> bool:
        if head.count(b"\n") > MAX_HEADERS:
            self._send(connection, "GET", 431, b"Request Header Fields Too Large\n", TEXT, {}, False)
            return False
        request = _parse_head(head)
        if request is None:
            self._send(connection, "GET", 400, b"Bad Request\n", TEXT, {}, False)
            return False
        method, target, version, headers = request
        status, body, content_type, extra = self._respond(method, target, headers, connection.client)
        # Request bodies are never read: after one, the connection cannot be reused.
        keep_alive = (
            version == "HTTP/1.1"
            and headers.get("connection", "").lower() != "close"
            and headers.get("content-length", "0") == "0"
            and "transfer-encoding" not in headers
        )
        self._send(connection, method, status, body, content_type, extra, keep_alive)
        return keep_alive

    def _respond(
        self, method: str, target: str, headers: dict[str, str], client: str
    ) -> tuple[int, bytes, str, dict[str, str]]:
        config = self._config
        if config is not None and config.users:
            verdict = self._auth.check(config, headers.get("authorization"), client)
            if verdict == LIMITED:
                return (
                    429,
                    b"Too Many Requests: too many failed logins from your address, retry later\n",
                    TEXT,
                    {"Retry-After": str(round(CLIENT_REFILL_SECONDS))},
                )
            if verdict != OK:
                return (
                    401,
                    b"Unauthorized\n",
                    TEXT,
                    {"WWW-Authenticate": 'Basic realm="neuron-exporter", charset="UTF-8"'},
                )
        # Everything, health paths included, is behind basic auth when it is configured, as in Prometheus'
        # exporter-toolkit (which exempts no path): a probe sends the credentials, or probes the TCP port.
        if method not in ("GET", "HEAD"):
            return 405, b"Method Not Allowed: use GET or HEAD\n", TEXT, {"Allow": "GET, HEAD"}
        try:
            parts = urlsplit(target)
            path, query = parts.path, parse_qs(parts.query, max_num_fields=10)
        except ValueError:
            path, query = "", {}
        if path == "/metrics":
            return self._metrics(headers)
        if path in self._pages:
            return self._page(path, query)
        if path in HEALTH:
            return 200, HEALTH[path], TEXT, {}
        if path == "/":
            return 200, LANDING_PAGE.format(version=html.escape(__version__)).encode(), "text/html; charset=utf-8", {}
        return 404, b"Not Found: see /metrics\n", TEXT, {}

    def _page(self, path: str, query: dict[str, list[str]]) -> tuple[int, bytes, str, dict[str, str]]:
        try:
            # A page costs a render too (a diagnosis): shared and paced like /metrics.
            render = self._renders.get((path, repr(sorted(query.items()))), lambda: self._pages[path](query))
            body, content_type = render.body, render.content_type
        except Exception as error:  # noqa: BLE001 (the server must survive a failing page)
            self._log_once(f"rendering {path} failed: {type(error).__name__}: {error}")
            return 500, f"error: rendering {path} failed, see the exporter's log\n".encode(), TEXT, {}
        return 200, body, content_type, {}

    def _metrics(self, headers: dict[str, str]) -> tuple[int, bytes, str, dict[str, str]]:
        try:
            if callable(getattr(self._source, "collect", None)):
                encoder, content_type = choose_encoder(headers.get("accept", ""))
                render = self._renders.get(content_type, lambda: (encoder(self._source), content_type))
            else:
                render = self._renders.get(CONTENT_TYPE, lambda: (self._source(), CONTENT_TYPE))
            body = render.gzipped() if gzip_accepted(headers.get("accept-encoding", "")) else render.body
        except Exception as error:  # the server must survive a failing collector
            self._log_once(f"rendering /metrics failed: {type(error).__name__}: {error}")
            log.debug("rendering /metrics failed", exc_info=True)
            return 500, b"error: collecting metrics failed, see the exporter's log\n", TEXT, {}
        extra = {"Content-Encoding": "gzip"} if body is not render.body else {}
        return 200, body, render.content_type, extra

    def _send(
        self,
        connection: _Connection,
        method: str,
        status: int,
        body: bytes,
        content_type: str,
        extra: dict[str, str],
        keep_alive: bool,
    ) -> None:
        lines = [
            f"HTTP/1.1 {status} {HTTPStatus(status).phrase}",
            "Server: neuron-exporter",
            f"Date: {formatdate(usegmt=True)}",
            f"Content-Type: {content_type}",
            f"Content-Length: {len(body)}",
            *(f"{name}: {value}" for name, value in extra.items()),
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


def url_of(listener: socket.socket, addr: str, tls: bool) -> str:
    return f"{'https' if tls else 'http'}://{_url_host(addr)}:{listener.getsockname()[1]}/metrics"


def _parse_head(head: bytes) -> tuple[str, str, str, dict[str, str]] | None:
    """(method, target, version, headers with lower-case names) of a request head; None if malformed."""
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
    return parts[0], parts[1], parts[2], headers


def _send_all(sock: socket.socket, data: bytes, deadline: float) -> None:
    """Send everything before ``deadline``: a client that reads slowly cannot hold a worker for longer."""
    view = memoryview(data)
    while view:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("the client did not read the response in time")
        sock.settimeout(remaining)
        view = view[sock.send(view) :]


def _url_host(addr: str) -> str:
    if addr in ("", "0.0.0.0"):
        return "127.0.0.1"
    if addr == "::":
        return "[::1]"
    return f"[{addr}]" if ":" in addr else addr
