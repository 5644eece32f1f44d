"""One GET of a page from an endpoint that may be anything: a wrong port, a proxy, a hostile server.

The whole exchange (connection, TLS handshake, response head and body) ends within ``timeout`` seconds however the
server paces its bytes: a watchdog shuts the socket down at the deadline. Whatever goes wrong is a ``FetchError``
of one line. Redirects are not followed: an endpoint of the exporter never redirects, and following one would send
the credentials wherever it points.
"""

from __future__ import annotations

import http.client
import socket
import ssl
import threading
from urllib.parse import urlsplit

from .. import __version__
from ..untrusted import printable

MAX_DETAIL = 200  # characters of what the server sent, in a message


class FetchError(Exception):
    """One line saying what went wrong (the message); ``status``, if the server answered with a status other than
    200."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


def fetch(url: str, timeout: float, max_bytes: int, context: ssl.SSLContext | None, headers: dict[str, str]) -> bytes:
    """The body of a 200 answer to a GET of ``url`` (http or https), of at most ``max_bytes``, within ``timeout``
    seconds in all; ``FetchError`` otherwise."""
    parts = urlsplit(url)
    try:
        host, port = parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as error:
        raise FetchError(f"bad address: {error}") from None
    fired = threading.Event()
    sock: socket.socket | None = None

    def cut() -> None:
        fired.set()
        try:
            if sock is not None:  # a blocked read or handshake returns at once; of TLS, the socket under it
                socket.socket.shutdown(sock, socket.SHUT_RDWR)
        except OSError:
            pass

    watchdog = threading.Timer(timeout, cut)
    watchdog.daemon = True
    watchdog.start()
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
        if parts.scheme == "https":  # the socket the watchdog shuts down is the TLS one before its handshake
            tls = context or ssl.create_default_context()
            sock = tls.wrap_socket(sock, server_hostname=host, do_handshake_on_connect=False)
        if fired.is_set():
            cut()
        if isinstance(sock, ssl.SSLSocket):
            sock.do_handshake()
        body = _exchange(sock, parts, host, port, max_bytes, headers)
        if fired.is_set():  # what came before the socket was shut down, taken for the whole answer
            raise FetchError("timed out")
        return body
    except FetchError:
        if fired.is_set():
            raise FetchError(f"timed out after {timeout:g} s") from None
        raise
    except (OSError, ValueError, http.client.HTTPException) as error:
        if fired.is_set() or isinstance(error, TimeoutError):
            raise FetchError(f"timed out after {timeout:g} s") from None
        raise FetchError(_describe(error)) from None
    finally:
        watchdog.cancel()
        if sock is not None:
            sock.close()


def _exchange(
    sock: socket.socket,
    parts,
    host: str,
    port: int,
    max_bytes: int,
    headers: dict[str, str],
) -> bytes:
    connection = http.client.HTTPConnection(host, port)
    connection.sock = sock  # connected (and its deadline watched) by the caller
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    connection.request(
        "GET", target, headers={"User-Agent": f"neuron-exporter/{__version__}", "Connection": "close", **headers}
    )
    response = connection.getresponse()
    if response.status != 200:
        message = f"HTTP {response.status} {printable(response.reason, MAX_DETAIL)}".rstrip()
        location = response.getheader("Location")
        if 300 <= response.status < 400 and location:
            message += f", redirected to {printable(location, MAX_DETAIL)} (not followed: give that address)"
        raise FetchError(message, response.status)
    length = response.getheader("Content-Length")
    if length is not None and length.isdigit() and int(length) > max_bytes:
        raise FetchError(f"the answer is larger than a diagnosis page ({max_bytes} bytes)")
    body = bytearray()
    while len(body) <= max_bytes:
        piece = response.read(min(65536, max_bytes + 1 - len(body)))
        if not piece:
            break
        body += piece
    if len(body) > max_bytes:
        raise FetchError(f"the answer is larger than a diagnosis page ({max_bytes} bytes)")
    if response.length:  # a Content-Length the body did not reach
        raise FetchError(f"the body was cut short: {response.length} bytes short of its Content-Length")
    return bytes(body)


def _describe(error: Exception) -> str:
    """``error`` in one line of bounded length."""
    if isinstance(error, ssl.SSLError):  # a ValueError too when the certificate is refused
        detail = f"TLS: {error.reason or error}"
    elif isinstance(error, http.client.IncompleteRead):
        detail = f"the body was cut short or its chunks malformed ({len(error.partial)} bytes read)"
    elif isinstance(error, OSError):
        detail = error.strerror or str(error)
    elif isinstance(error, UnicodeError):
        detail = str(error)
    else:  # http.client's errors and what its parsing raised
        detail = f"not a valid HTTP answer: {str(error) or type(error).__name__}"
    return printable(" ".join(detail.split()), 300)
