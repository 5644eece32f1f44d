"""The HTTP endpoint: ``/metrics``, ``/diagnosis``, the probes' ``/-/healthy`` and ``/-/ready`` and a small landing
page, optionally behind TLS and basic auth. ``GET`` and ``HEAD``; any other method is 405.

Used both by ``attach()`` inside a training process and by the node daemon. ``connections`` carries the requests and
bounds what clients cost; this module answers them. ``/metrics`` and the probes have workers of their own (a lane), so
they never wait behind a page; a request whose credentials need bcrypt (``basic_auth``) waits in a login lane, so a
scraper already logged in never waits behind password guesses. Renders of ``/metrics`` are shared by the requests that
wait for them and paced for all clients together (``shared_render``: ``RENDERS_PER_SECOND`` past ``RENDERS_BURST``); a
page is rendered at most once per ``PAGE_INTERVAL_SECONDS`` (or ``PAGE_COST_FACTOR`` times what its render took, if
longer) whatever its query string says. It serves nothing else: no file paths, no environment.
"""

from __future__ import annotations

import gzip
import html
import logging
import re
import socket
import ssl
from collections.abc import Callable
from concurrent.futures import Future
from os import PathLike
from typing import Any
from urllib.parse import parse_qs, urlsplit

from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, choose_encoder

from .. import __version__, diagnosis
from .basic_auth import BCRYPT_AT_ONCE, BUSY, CLIENT_REFILL_SECONDS, LIMITED, OK, BasicAuth
from .connections import Connections, bind_listener
from .http_messages import TEXT, Request, Response
from .name_selection import SelectedCollector, select_text
from .rate_limit import Pacer
from .shared_render import Render, SharedRender
from .web_config import WebConfig, WebConfigReloader, load_web_config

log = logging.getLogger(__name__)

# Renders of /metrics and pages, for all clients together: a render costs the process CPU (a training process its
# GIL), so past a burst they are paced, and the requests that wait share the next one. Prometheus scrapes every 15 to
# 60 s; a few servers and people stay far below this.
RENDERS_PER_SECOND, RENDERS_BURST = 2.0, 10
PAGE_INTERVAL_SECONDS, PAGE_COST_FACTOR = 5.0, 4.0
# Workers of the lane of /metrics and the probes, and of the lane of everything else: pages, the landing page.
METRICS_WORKERS, PAGE_WORKERS = 6, 2
# Requests whose credentials need bcrypt, of clients that have not failed and of clients that have; their workers
# wait for bcrypt's process-wide slots, so there are as many as slots (a lane's threads start only when needed).
LOGIN_WORKERS = BCRYPT_AT_ONCE
METRICS_LANE, PAGE_LANE, LOGIN_LANE, FAILED_LOGIN_LANE = 0, 1, 2, 3
HEALTH = {"/-/healthy": b"neuron-exporter is Healthy.\n", "/-/ready": b"neuron-exporter is Ready.\n"}
UNAUTHORIZED = Response(
    401, b"Unauthorized\n", TEXT, {"WWW-Authenticate": 'Basic realm="neuron-exporter", charset="UTF-8"'}
)
TOO_MANY_LOGINS = Response(
    429,
    b"Too Many Requests: too many failed logins from your address, retry later\n",
    TEXT,
    {"Retry-After": str(round(CLIENT_REFILL_SECONDS))},
)
TOO_MANY_LOGINS_AT_ONCE = Response(
    429, b"Too Many Requests: too many logins at once, retry later\n", TEXT, {"Retry-After": "1"}
)
NOT_ALLOWED = Response(405, b"Method Not Allowed: use GET or HEAD\n", TEXT, {"Allow": "GET, HEAD"})
NOT_FOUND = Response(404, b"Not Found: see /metrics\n", TEXT)
QVALUE = re.compile(r"0(\.[0-9]{0,3})?|1(\.0{0,3})?")

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
    or text, as prometheus_client chooses from the Accept header), or a function that returns text format 0.0.4
    (the node view, which merges the ranks' text expositions): always served as text 0.0.4.

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
        self._renders = SharedRender(Pacer(RENDERS_PER_SECOND, RENDERS_BURST))
        self._page_renders = SharedRender(reuse_seconds=PAGE_INTERVAL_SECONDS, reuse_factor=PAGE_COST_FACTOR)
        self._logged: set[str] = set()
        listener = listener if listener is not None else bind_listener(addr, port)
        self.addr = addr
        self.port: int = listener.getsockname()[1]
        self.url = url_of(listener, addr, web_config)
        workers = (METRICS_WORKERS, PAGE_WORKERS, LOGIN_WORKERS, LOGIN_WORKERS)
        self._connections = Connections(self._respond, listener, self._tls_for_new_connections, workers, self._lane_of)

    @property
    def web_config(self) -> WebConfig | None:
        return self._config

    def start(self) -> MetricsServer:
        self._connections.start()
        return self

    def stop(self) -> None:
        """Stop serving and close every connection, kept-alive ones too: a stopped server must not answer a
        scraper that keeps its socket. Returns without waiting for a render in progress."""
        self._connections.stop()

    def close_inherited_socket(self) -> None:
        """In a child made by fork: close this copy of the listening socket and of the connections, leaving the
        parent serving."""
        self._connections.close_inherited()

    def __enter__(self) -> MetricsServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _tls_for_new_connections(self) -> ssl.SSLContext | None:
        # Where a changed web config file is picked up (for basic auth too): when clients connect.
        self._config = self._configs.current()
        return self._config.ssl_context if self._config is not None else None

    def _respond(self, request: Request) -> Response | Future:
        config = self._config
        if config is not None and config.users:
            verdict = self._auth.check(config, request.headers.get("authorization"), request.client, request.arrived)
            if verdict == LIMITED:
                return TOO_MANY_LOGINS
            if verdict == BUSY:
                return TOO_MANY_LOGINS_AT_ONCE
            if verdict != OK:
                return UNAUTHORIZED
        # Everything, health paths included, is behind basic auth when it is configured, as in Prometheus'
        # exporter-toolkit (which exempts no path): a probe sends the credentials, or probes the TCP port.
        if request.method not in ("GET", "HEAD"):
            return NOT_ALLOWED
        path, query = _path_and_query(request.target)
        if path == "/metrics":
            return self._metrics(request.headers, frozenset(query.get("name[]", ())))
        if path in self._pages:
            return self._page(path, query)
        if path in HEALTH:
            return Response(200, HEALTH[path], TEXT)
        if path == "/":
            return Response(
                200, LANDING_PAGE.format(version=html.escape(__version__)).encode(), "text/html; charset=utf-8"
            )
        return NOT_FOUND

    def _lane_of(self, request: Request) -> int:
        config = self._config
        if config is not None and config.users:
            if self._auth.waits_for_bcrypt(config, request.headers.get("authorization"), request.client):
                return FAILED_LOGIN_LANE if self._auth.failed_before(request.client) else LOGIN_LANE
        path = _path_and_query(request.target)[0]
        return METRICS_LANE if path == "/metrics" or path in HEALTH else PAGE_LANE

    def _page(self, path: str, query: dict[str, list[str]]) -> Future:
        # Only the format picks a variant: any other parameter (?x=N) would only make a render nobody shares.
        query = {"format": ["json"]} if query.get("format") == ["json"] else {}
        render = self._page_renders.ask((path, bool(query)), lambda: self._pages[path](query))
        return _then(render, lambda done: self._page_response(path, done))

    def _page_response(self, path: str, render: Future[Render]) -> Response:
        try:
            result = render.result()
        except Exception as error:  # noqa: BLE001 (the server must survive a failing page)
            self._log_once(f"rendering {path} failed: {type(error).__name__}: {error}")
            return Response(500, f"error: rendering {path} failed, see the exporter's log\n".encode(), TEXT)
        return Response(200, result.body, result.content_type)

    def _metrics(self, headers: dict[str, str], names: frozenset[str]) -> Future:
        """The exposition, or with ``names`` (``?name[]=``) only the samples of those names."""
        if callable(getattr(self._source, "collect", None)):
            encoder, content_type = choose_encoder(headers.get("accept", ""))
            source = SelectedCollector(self._source, names) if names else self._source
            render = self._renders.ask((content_type, names), lambda: (encoder(source), content_type))
            return _then(render, lambda done: self._metrics_response(headers, done))
        # Text already rendered (the node view merges the ranks' text expositions): re-typing it as OpenMetrics
        # would mean parsing all of it again on every scrape, for nothing a scraper needs; Prometheus, which asks
        # for OpenMetrics first, takes text as well. A selection is cut from the one render every scrape shares.
        render = self._renders.ask(CONTENT_TYPE_PLAIN_0_0_4, lambda: (self._source(), CONTENT_TYPE_PLAIN_0_0_4))
        return _then(render, lambda done: self._metrics_response(headers, done, names))

    def _metrics_response(
        self, headers: dict[str, str], render: Future[Render], selection: frozenset[str] = frozenset()
    ) -> Response:
        try:
            result = render.result()
            gzipped = gzip_accepted(headers.get("accept-encoding", ""))
            if selection:
                body = select_text(result.body, selection)
                body = gzip.compress(body, compresslevel=1) if gzipped else body
            else:
                body = result.gzipped() if gzipped else result.body
        except Exception as error:  # the server must survive a failing collector
            self._log_once(f"rendering /metrics failed: {type(error).__name__}: {error}")
            log.debug("rendering /metrics failed", exc_info=error)
            return Response(500, b"error: collecting metrics failed, see the exporter's log\n", TEXT)
        return Response(200, body, result.content_type, {"Content-Encoding": "gzip"} if gzipped else {})

    def _log_once(self, message: str) -> None:
        if message not in self._logged and len(self._logged) < 100:
            self._logged.add(message)
            log.warning("%s", message)


def _path_and_query(target: str) -> tuple[str, dict[str, list[str]]]:
    # Every field of the query is parsed, none refused: the head, and so the query, is at most MAX_HEAD_BYTES, and
    # a field the endpoint does not know (a scrape config's params, a cache buster) is ignored where it is used.
    try:
        parts = urlsplit(target)
        return parts.path, parse_qs(parts.query)
    except ValueError:
        return "", {}


def gzip_accepted(accept_encoding: str) -> bool:
    """Whether ``Accept-Encoding`` names gzip with a weight above 0 (``gzip;q=0`` is "not acceptable", RFC 9110
    12.5.3 and 12.4.2; a weight that is not a number makes the entry void)."""
    for entry in accept_encoding.split(","):
        coding, *parameters = (part.strip() for part in entry.split(";"))
        if coding.lower() not in ("gzip", "x-gzip"):
            continue
        weight = next((p[2:].strip() for p in parameters if p[:2].lower() == "q="), "1")
        if QVALUE.fullmatch(weight) and float(weight) > 0:
            return True
    return False


def _then(render: Future[Render], respond: Callable[[Future[Render]], Response]) -> Future:
    """A Future of the response ``respond`` makes of ``render`` once it is done."""
    response: Future[Response] = Future()
    render.add_done_callback(lambda done: response.set_result(respond(done)))
    return response


def url_of(listener: socket.socket, addr: str, web_config: WebConfig | None) -> str:
    """The ``/metrics`` URL of a server listening on ``listener``, bound to ``addr``, with ``web_config``."""
    scheme = "https" if web_config is not None and web_config.tls else "http"
    return f"{scheme}://{_url_host(addr)}:{listener.getsockname()[1]}/metrics"


def metrics_server(
    source: Callable[[], bytes] | object,
    make_diagnosis: Callable[[], dict],
    addr: str,
    port: int,
    web_config: WebConfig | str | PathLike | None,
    listener: socket.socket | None = None,
) -> MetricsServer:
    """An endpoint of the exporter (a rank's, a job's node endpoint, the daemon): ``source`` at ``/metrics`` and the
    document ``make_diagnosis()`` returns at ``/diagnosis``. Bound, not yet serving."""
    return MetricsServer(
        source, addr, port, web_config, pages={"/diagnosis": diagnosis.page(make_diagnosis)}, listener=listener
    )


def _url_host(addr: str) -> str:
    if addr in ("", "0.0.0.0"):
        return "127.0.0.1"
    if addr == "::":
        return "[::1]"
    return f"[{addr}]" if ":" in addr else addr
