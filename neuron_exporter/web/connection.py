"""One connection of the endpoint: its socket, what it is doing (``state``), what it received and has yet to send.

Its socket never blocks: a read or a write does what the socket allows now and says what to wait for before the
next. Only the loop thread of ``connections`` reads, writes and changes it; a worker reads its request.
"""

from __future__ import annotations

import selectors
import socket
import ssl
from collections import deque

from .admission import WAITING, WAITING_SERVED
from .http_messages import Request

CLOSED = -1  # past every state of ``admission.STATES``: its socket is closed
WRITE_CHUNK, WRITE_TURN = 65536, 1 << 20  # bytes per send; per connection before the others get their turn


class Connection:
    __slots__ = (
        "sock",
        "client",
        "state",
        "deadline",
        "handshaking",
        "events",
        "buffer",
        "request",
        "output",
        "keep_alive",
        "paused_until",
        "served",
    )

    def __init__(self, sock: socket.socket, client: str, deadline: float):
        self.sock: socket.socket | None = sock
        self.client = client  # its key for rate limits: the address, or its /64 for IPv6
        self.state = WAITING  # PAUSED, WAITING, WRITING, BUSY (a request in its lane), CLOSED
        self.deadline = deadline  # monotonic time by which its head must come, or its response be read
        self.handshaking = False
        self.events = 0  # what the selector watches it for
        self.buffer = bytearray()  # received and not yet answered
        self.request: Request | None = None  # the one being answered
        self.output: deque[memoryview] | None = None  # the rest of its response
        self.keep_alive = False  # after the response being written
        self.paused_until = 0.0  # while its client is refused too often: monotonic time until it is read again
        self.served = False  # a request of it got a 2xx answer

    def rank(self) -> int:
        """Its state as ``admission`` orders them: one waiting after a 2xx answer goes after one that never had it."""
        return WAITING_SERVED if self.state == WAITING and self.served else self.state

    def receive(self) -> bytes | int:
        """What came (b"": the peer closed), after the TLS handshake if it is not done; or, while nothing can be read,
        the selector events to wait for. ``OSError`` or ``ValueError``: the connection failed."""
        sock = self.sock
        assert sock is not None  # open while in the selector
        try:
            if self.handshaking:
                assert isinstance(sock, ssl.SSLSocket)
                sock.do_handshake()
                self.handshaking = False
            data = sock.recv(65536)
            while data and isinstance(sock, ssl.SSLSocket) and sock.pending():
                data += sock.recv(sock.pending())  # decrypted already: select() will not say so
        except (BlockingIOError, InterruptedError, ssl.SSLWantReadError):
            return selectors.EVENT_READ  # a handshake no longer waits to write: a writable socket would wake the loop
        except ssl.SSLWantWriteError:  # the handshake's reply did not fit in the socket's buffer
            return selectors.EVENT_READ | selectors.EVENT_WRITE
        return data

    def send(self) -> int:
        """Send what the socket takes of the response, up to ``WRITE_TURN`` bytes: the selector events to wait for
        before sending the rest, 0 once all is sent. ``OSError`` or ``ValueError``: the connection failed."""
        sock, output = self.sock, self.output
        assert sock is not None and output is not None  # open, with a response, while writing
        sent = 0
        try:
            while output and sent < WRITE_TURN:
                n = sock.send(output[0][:WRITE_CHUNK])  # the same bytes again after a want-write, as TLS requires
                output[0], sent = output[0][n:], sent + n
                if not output[0]:
                    output.popleft()
        except (BlockingIOError, InterruptedError, ssl.SSLWantWriteError):
            pass
        except ssl.SSLWantReadError:
            return selectors.EVENT_READ
        return selectors.EVENT_WRITE if output else 0
