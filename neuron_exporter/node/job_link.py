"""The link between a training process and the node endpoint process it started (a Unix socket pair).

The endpoint asks; the training process answers from its spool thread:
- ``b"m"``: the process's own exposition and rank header (fresher than its spool file, and served even where the
  spool directory is refused);
- ``b"d"``: its diagnosis document (``null`` if it has nothing to show yet).
A request is one byte of kind and a 4-byte sequence number; an answer is a header (two lengths), a JSON object that
repeats the sequence number, and a body. An answer that comes after its asker gave up is skipped by the next asker.
The first message, from the training process, is the endpoint's configuration (JSON, as an answer with sequence 0).
"""

from __future__ import annotations

import json
import select
import socket
import struct
import threading
import time

METRICS = b"m"
DIAGNOSIS = b"d"
REQUEST = struct.Struct("!cI")
HEADER = struct.Struct("!II")
MAX_DOCUMENT_BYTES = 1024 * 1024
MAX_BODY_BYTES = 64 * 1024 * 1024


class LinkClosed(OSError):
    """The other end closed the link (its process ended), or sent something that is not the protocol."""


def send_answer(sock: socket.socket, document: dict, body: bytes = b"") -> None:
    data = json.dumps(document, separators=(",", ":")).encode()
    sock.sendall(HEADER.pack(len(data), len(body)) + data + body)


def read_exactly(sock: socket.socket, size: int, deadline: float | None) -> bytes:
    """``size`` bytes; ``TimeoutError`` past ``deadline`` (monotonic; None: wait), ``LinkClosed`` at the end."""
    chunks = []
    while size:
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([sock], [], [], remaining)[0]:
                raise TimeoutError("no answer on the link in time")
        chunk = sock.recv(min(size, 1 << 20))
        if not chunk:
            raise LinkClosed("the link was closed")
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def read_answer(sock: socket.socket, deadline: float | None) -> tuple[dict, bytes]:
    sizes = read_exactly(sock, HEADER.size, deadline)
    document_size, body_size = HEADER.unpack(sizes)
    if document_size > MAX_DOCUMENT_BYTES or body_size > MAX_BODY_BYTES:
        raise LinkClosed("an answer larger than the link allows")
    # Once an answer has begun, the rest of it is on its way: a late deadline would leave half of it in the socket.
    document = json.loads(read_exactly(sock, document_size, None))
    body = read_exactly(sock, body_size, None)
    if not isinstance(document, dict):
        raise LinkClosed("an answer that is not a JSON object")
    return document, body


class Asker:
    """The endpoint's end: one question at a time, each with a deadline."""

    def __init__(self, sock: socket.socket):
        self._sock = sock
        self._lock = threading.Lock()
        self._sequence = 0
        self.closed = False

    def ask(self, kind: bytes, timeout: float) -> tuple[dict, bytes] | None:
        """The answer to ``kind``, or None if none came within ``timeout`` seconds or the link is closed."""
        with self._lock:
            if self.closed:
                return None
            self._sequence = self._sequence % 0xFFFFFFFF + 1
            deadline = time.monotonic() + timeout
            try:
                self._sock.sendall(REQUEST.pack(kind, self._sequence))
                while True:
                    document, body = read_answer(self._sock, deadline)
                    if document.get("sequence") == self._sequence:
                        return document, body
            except TimeoutError:
                return None
            except (OSError, ValueError):
                self.closed = True
                return None


def read_requests(sock: socket.socket) -> list[tuple[bytes, int]]:
    """The requests waiting on the training process's end (call when it is readable); ``LinkClosed`` at its end."""
    data = sock.recv(REQUEST.size * 64)
    if not data:
        raise LinkClosed("the node endpoint closed the link")
    # Requests are tiny and written whole; a partial one would mean a broken peer.
    if len(data) % REQUEST.size:
        raise LinkClosed("a partial request")
    return [REQUEST.unpack_from(data, offset) for offset in range(0, len(data), REQUEST.size)]
