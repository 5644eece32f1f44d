"""HTTP/1.1 messages of the connection layer: a request head parsed, its framing checked as RFC 9112 asks, and a
response serialized. Nothing here knows a path, a metric or a user.

Request bodies are never read (the endpoint serves GET and HEAD), so a request that announces one is answered and its
connection closed: whatever follows the head is never taken for a request. A head whose framing is ambiguous (more
than one ``Content-Length``, one that is not a number, ``Transfer-Encoding`` with ``Content-Length``, a transfer
coding that does not end in ``chunked``, more than one ``Host``, or none in HTTP/1.1) gets 400 and the connection
closes, so no proxy in front and this server can disagree on where the next request starts. So does a control
character in a line (but a tab, and the CR that ends it): a bare CR ends the line for some proxies and not here (RFC
9112 2.2), and a NUL ends a C string (RFC 9110 5.5).
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from email.utils import formatdate
from http import HTTPStatus
from typing import NamedTuple

TEXT = "text/plain; charset=utf-8"
MAX_HEAD_BYTES = 16384
MAX_HEADERS = 100
HEAD_END = re.compile(rb"\r?\n\r?\n")
TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
DIGITS = re.compile(r"[0-9]+")
CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")  # in a line without its CR LF; a tab is allowed in a value
SMALL_BODY_BYTES = 65536  # sent in one piece with the head


class Request(NamedTuple):
    method: str
    target: str
    version: str
    headers: dict[str, str]  # names in lower case; a repeated header's values joined with ", "
    client: str  # its key for rate limits: the address, or its /64 for IPv6
    arrived: float  # monotonic time the server took it up: whatever it waits for counts from then


class Response(NamedTuple):
    status: int
    body: bytes  # sent for GET; for HEAD only its length is
    content_type: str
    headers: Mapping[str, str] = {}


TOO_LARGE = Response(431, b"Request Header Fields Too Large\n", TEXT)
BAD_REQUEST = Response(400, b"Bad Request\n", TEXT)


def parse_request(head: bytes, client: str) -> Request | Response:
    """The request of a head (without its blank line), or the response that refuses it (then close)."""
    if len(head) > MAX_HEAD_BYTES or head.count(b"\n") > MAX_HEADERS:
        return TOO_LARGE
    lines = [line.removesuffix("\r") for line in head.decode("latin-1").split("\n")]
    if any(CONTROL.search(line) for line in lines):
        return BAD_REQUEST
    parts = lines[0].split(" ")
    if len(parts) != 3 or not TOKEN.fullmatch(parts[0]) or parts[2] not in ("HTTP/1.0", "HTTP/1.1"):
        return BAD_REQUEST
    headers: dict[str, str] = {}
    seen: dict[str, int] = {}
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if not colon or not TOKEN.fullmatch(name):  # no space before the colon, no folded line (RFC 9112 5.1)
            return BAD_REQUEST
        name, value = name.lower(), value.strip(" \t")
        seen[name] = seen.get(name, 0) + 1
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    if not _framing_is_clear(headers, seen, parts[2]):
        return BAD_REQUEST
    return Request(parts[0], parts[1], parts[2], headers, client, time.monotonic())


def _framing_is_clear(headers: dict[str, str], seen: dict[str, int], version: str) -> bool:
    if seen.get("content-length", 0) > 1 or seen.get("host", 0) > 1:
        return False
    if version == "HTTP/1.1" and "host" not in headers:  # RFC 9112 3.2: 400
        return False
    if "content-length" in headers and not DIGITS.fullmatch(headers["content-length"]):
        return False
    if "transfer-encoding" in headers:
        codings = [coding.strip().lower() for coding in headers["transfer-encoding"].split(",")]
        if "content-length" in headers or version == "HTTP/1.0" or codings[-1] != "chunked":
            return False
    return True


def keeps_alive(request: Request) -> bool:
    """Whether the connection may carry another request after this one: HTTP/1.1, not closed by the client, and no
    body (a body is never read, so what follows the head could be its bytes)."""
    headers = request.headers
    return (
        request.version == "HTTP/1.1"
        and "close" not in (token.strip().lower() for token in headers.get("connection", "").split(","))
        and not headers.get("content-length", "0").lstrip("0")  # digits only (checked): any length but 0
        and "transfer-encoding" not in headers
    )


def serialize(method: str, response: Response, keep_alive: bool) -> list[bytes]:
    """The response's bytes, in parts: a large body is its own part, sent as it is (never copied for each client)."""
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
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    if method == "HEAD" or not body:
        return [head]
    return [head + body] if len(body) <= SMALL_BODY_BYTES else [head, body]
