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
