"""Request framing as RFC 9112 asks: a head whose body length is ambiguous gets 400 and its connection closes, so
nothing after it, whatever a proxy in front made of it, is read as a request."""

from __future__ import annotations

import re

import pytest

from tests.support.http import BODY, raw_exchange

SMUGGLED = b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n"  # 31 bytes: a body that looks like a request


def head(*headers: str) -> bytes:
    return b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + b"".join(f"{h}\r\n".encode() for h in headers) + b"\r\n"


def statuses(reply: bytes) -> list[bytes]:
    return re.findall(rb"HTTP/1.1 (\d+)", reply)


AMBIGUOUS = {
    "conflicting content-length": head("Content-Length: 31", "Content-Length: 0"),  # which one did a proxy use?
    "duplicate content-length": head("Content-Length: 0", "Content-Length: 0"),
    "content-length list": head("Content-Length: 31, 31"),
    "signed content-length": head("Content-Length: +31"),
    "negative content-length": head("Content-Length: -1"),
    "hex content-length": head("Content-Length: 0x1f"),
    "chunked and content-length": head("Transfer-Encoding: chunked", "Content-Length: 31"),
    "content-length and chunked": head("Content-Length: 31", "Transfer-Encoding: chunked"),
    "not chunked": head("Transfer-Encoding: gzip"),  # no way to find the body's end
    "chunked not last": head("Transfer-Encoding: chunked, identity"),
    "chunked in http/1.0": b"GET /metrics HTTP/1.0\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n",
    "two hosts": head("Host: y"),
    "no host in http/1.1": b"GET /metrics HTTP/1.1\r\n\r\n",
    "space before the colon": b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length : 31\r\n\r\n",
}


@pytest.mark.parametrize("request_head", AMBIGUOUS.values(), ids=AMBIGUOUS)
def test_ambiguous_framing_is_a_400_and_the_connection_closes(server, request_head):
    s = server()
    reply = raw_exchange(s.port, request_head + SMUGGLED + SMUGGLED)
    assert statuses(reply) == [b"400"], reply[:200]
    assert b"Connection: close" in reply


# A control character in a line is refused as ambiguous framing is: a proxy that ends lines at a bare CR sees a
# header that this server would not have seen (here a body of 31 bytes: the smuggled request).
INVALID_CHARACTERS = {
    "bare cr hides a header": head("X-A: a\rContent-Length: 31"),
    "bare cr before the line end": head("X-A: a\r\r"),
    "bare cr in the request line": b"GET /metrics\rX HTTP/1.1\r\nHost: x\r\n\r\n",
    "nul in a value": head("X-A: a\0b"),
    "nul in the host": b"GET /metrics HTTP/1.1\r\nHost: x\0.evil\r\n\r\n",
    "escape in a value": head("X-A: \x1b[2J"),
    "delete in a value": head("X-A: a\x7f"),
}


@pytest.mark.parametrize("request_head", INVALID_CHARACTERS.values(), ids=INVALID_CHARACTERS)
def test_a_control_character_in_a_line_is_a_400_and_the_connection_closes(server, request_head):
    s = server()
    reply = raw_exchange(s.port, request_head + SMUGGLED)
    assert statuses(reply) == [b"400"], reply[:200]
    assert b"Connection: close" in reply


def test_a_tab_in_a_value_is_allowed(server):
    s = server()
    reply = raw_exchange(s.port, head("User-Agent: a\tb", "Connection: close"))
    assert statuses(reply) == [b"200"]


@pytest.mark.parametrize(
    "request_head",
    [head("Content-Length: 31"), head("Transfer-Encoding: chunked")],
    ids=["content-length", "chunked"],
)
def test_a_request_with_a_body_is_answered_and_its_body_never_read_as_a_request(server, request_head):
    s = server()
    body = SMUGGLED if b"Content-Length" in request_head else b"1f\r\n" + SMUGGLED + b"\r\n0\r\n\r\n"
    reply = raw_exchange(s.port, request_head + body + SMUGGLED)
    assert statuses(reply) == [b"200"] and reply.endswith(BODY)
    assert b"Connection: close" in reply


def test_content_length_zero_keeps_the_connection(server):
    s = server()
    reply = raw_exchange(s.port, head("Content-Length: 0") + head("Connection: close"))
    assert statuses(reply) == [b"200", b"200"]


def test_connection_close_among_other_tokens_closes(server):
    s = server()
    reply = raw_exchange(s.port, head("Connection: keep-alive, close") + head())
    assert statuses(reply) == [b"200"]
