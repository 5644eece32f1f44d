"""The HTTP endpoint: ``GET /metrics`` and a small landing page, optionally behind TLS and basic auth.

Used both by ``attach()`` inside a training process and by the node daemon. It serves nothing else:
no file paths, no environment, no request log on stderr.
"""

from __future__ import annotations

import gzip
import html
import logging
import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from os import PathLike
from urllib.parse import urlsplit

from .. import __version__

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
REQUEST_TIMEOUT_SECONDS = 10.0  # a client that stalls (or stalls the TLS handshake) frees its thread after this

LANDING_PAGE = """<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>neuron-exporter</title></head>
<body><h1>neuron-exporter</h1>
<p>Prometheus metrics for PyTorch/XLA training.</p>
<p><a href="/metrics">/metrics</a></p>
<p>version {version}</p>
</body></html>
"""


class MetricsServer:
    """Serves ``render()`` at ``/metrics`` from a daemon thread.

    The socket is bound in ``__init__`` (``OSError`` if the port is taken; ``port=0`` picks a free one),
    so a caller knows at once whether it holds the port. ``web_config`` is a ``WebConfig`` or the path of a
    web config file (same format as Prometheus exporters' ``--web.config.file``).
    """

    def __init__(self, render: Callable[[], bytes], addr: str = "0.0.0.0", port: int = 9478,
                 web_config=None):
        if isinstance(web_config, (str, PathLike)):
            from .web_config import load_web_config
            web_config = load_web_config(web_config)
        self.web_config = web_config
        self._server = _Server(addr, port, render, web_config)
        self._thread: threading.Thread | None = None
        self.addr = addr
        self.port: int = self._server.server_address[1]
        scheme = "https" if web_config is not None and web_config.tls else "http"
        self.url = f"{scheme}://{_url_host(addr)}:{self.port}/metrics"

    def start(self) -> MetricsServer:
        if self._thread is None:
            self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.2},
                                            name="neuron-exporter-http", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join()
            self._thread = None
        self._server.server_close()
        self._server.close_connections()

    def close_inherited_socket(self) -> None:
        """In a child made by fork: close this copy of the listening socket. The serving thread exists only
        in the parent, which keeps serving; ``stop()`` would wait for it forever here."""
        self._thread = None
        self._server.socket.close()

    def __enter__(self) -> MetricsServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _url_host(addr: str) -> str:
    if addr in ("", "0.0.0.0"):
        return "127.0.0.1"
    if addr == "::":
        return "[::1]"
    return f"[{addr}]" if ":" in addr else addr


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True  # only skips TIME_WAIT; a port with a live listener still fails to bind
    allow_reuse_port = False

    def __init__(self, addr: str, port: int, render, web_config):
        self.address_family = socket.AF_INET6 if ":" in addr else socket.AF_INET
        self.render = render
        self.web_config = web_config
        self.connections: set[socket.socket] = set()
        self.connections_lock = threading.Lock()
        super().__init__((addr, port), _Handler)

    def finish_request(self, request, client_address):
        # Runs in the per-connection thread, so a slow TLS handshake never holds up accept().
        with self.connections_lock:
            self.connections.add(request)
        try:
            tls = self.web_config.ssl_context if self.web_config is not None else None
            if tls is None:
                return super().finish_request(request, client_address)
            request.settimeout(REQUEST_TIMEOUT_SECONDS)
            try:
                conn = tls.wrap_socket(request, server_side=True)
            except (OSError, ValueError) as exc:
                log.debug("TLS handshake with %s failed: %s", client_address[0], exc)
                return
            try:
                super().finish_request(conn, client_address)
            finally:
                conn.close()
        finally:
            with self.connections_lock:
                self.connections.discard(request)

    def close_connections(self) -> None:
        """End kept-alive connections too: a stopped server must not answer a scraper that keeps its socket."""
        with self.connections_lock:
            for connection in self.connections:
                try:
                    connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def handle_error(self, request, client_address):
        log.debug("error serving %s", client_address[0], exc_info=True)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    timeout = REQUEST_TIMEOUT_SECONDS
    server_version = "neuron-exporter"
    sys_version = ""
    protocol_version = "HTTP/1.1"
    # Headers and body are two writes; with Nagle's algorithm a small body would wait for the client's
    # delayed ACK (40 ms) on a kept-alive connection, which is how Prometheus scrapes.
    disable_nagle_algorithm = True

    def do_GET(self):
        if not self._authorized():
            self._send(401, b"Unauthorized\n", "text/plain; charset=utf-8",
                       {"WWW-Authenticate": 'Basic realm="neuron-exporter", charset="UTF-8"'})
            return
        path = urlsplit(self.path).path
        if path == "/metrics":
            self._metrics()
        elif path == "/":
            page = LANDING_PAGE.format(version=html.escape(__version__)).encode()
            self._send(200, page, "text/html; charset=utf-8")
        else:
            self._send(404, b"Not Found: see /metrics\n", "text/plain; charset=utf-8")

    def _metrics(self):
        try:
            body = self.server.render()
        except Exception as exc:  # the server must survive a failing collector
            log.warning("rendering /metrics failed: %s: %s", type(exc).__name__, exc)
            log.debug("rendering /metrics failed", exc_info=True)
            self._send(500, b"error: collecting metrics failed, see the exporter's log\n",
                       "text/plain; charset=utf-8")
            return
        headers = {}
        if "gzip" in self.headers.get("Accept-Encoding", ""):
            body = gzip.compress(body, compresslevel=1)
            headers["Content-Encoding"] = "gzip"
        self._send(200, body, CONTENT_TYPE, headers)

    def _authorized(self) -> bool:
        config = self.server.web_config
        if config is None or not config.users:
            return True
        return config.check_authorization(self.headers.get("Authorization"))

    def _send(self, status: int, body: bytes, content_type: str, headers: dict[str, str] | None = None):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format, *args):  # noqa: A002 - signature of the base class
        pass
