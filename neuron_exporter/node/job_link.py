"""The link between a training process and its job's node endpoint (``job_endpoint``), both ends of it.

A training process that holds the port (``node_view``, the default) binds it here, not in the endpoint process, so
that ``attach()`` knows at once whether it holds the port, and which port ``port=0`` picked. It then starts the
endpoint process (``JobEndpointProcess``), a fresh interpreter (no fork of a training process, no torch) in a session
of its own, so a Ctrl-C in the terminal reaches the training script, which then stops it; it hands it the bound
socket and one end of a Unix socket pair, and answers its questions from its spool thread.

The endpoint asks (``Asker``); the training process answers:
- ``b"m"``: the process's own exposition and rank header (fresher than its spool file, and served even where the
  spool directory is refused);
- ``b"d"``: its diagnosis document (``null`` if it has nothing to show yet).
A request is one byte of kind and a 4-byte sequence number; an answer is a header (two lengths), a JSON object that
repeats the sequence number, and a body. An answer that comes after its asker gave up is read and dropped.
The first message, from the training process, is the endpoint's configuration (JSON, as an answer with sequence 0).
"""

from __future__ import annotations

import dataclasses
import json
import os
import select
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from ..config import AUTO_ENV, Options
from ..web.connections import bind_listener
from ..web.http_server import url_of
from ..web.web_config import WebConfig

METRICS = b"m"
DIAGNOSIS = b"d"
REQUEST = struct.Struct("!cI")
HEADER = struct.Struct("!II")
MAX_DOCUMENT_BYTES = 1024 * 1024
MAX_BODY_BYTES = 64 * 1024 * 1024
STOP_TIMEOUT_SECONDS = 5.0
SEND_TIMEOUT_SECONDS = 5.0
# The folder holding the neuron_exporter this process imported, searched last: an installed package is found as
# usual, and a source checkout that the training script put on its path is found too.
PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENDPOINT_MAIN = (
    f"import sys; sys.path.append({PACKAGE_PARENT!r}); "
    "from neuron_exporter.node.job_endpoint import main; sys.exit(main())"
)


class LinkClosed(OSError):
    """The other end closed the link (its process ended), or sent something that is not the protocol."""


def send_answer(sock: socket.socket, document: dict, body: bytes = b"") -> None:
    data = json.dumps(document, separators=(",", ":")).encode()
    sock.sendall(HEADER.pack(len(data), len(body)) + data + body)


def readable(sockets: list[socket.socket], timeout: float) -> list[socket.socket]:
    """Those of ``sockets`` with something to read (or closed) within ``timeout`` seconds. poll(), not select(): a
    training process often has descriptors past 1023, which select() refuses."""
    poller = select.poll()
    for sock in sockets:
        poller.register(sock, select.POLLIN)
    ready = {fd for fd, _ in poller.poll(max(0.0, timeout) * 1000)}
    return [sock for sock in sockets if sock.fileno() in ready]


def read_exactly(sock: socket.socket, size: int, deadline: float | None) -> bytes:
    """``size`` bytes; ``TimeoutError`` past ``deadline`` (monotonic; None: wait), ``LinkClosed`` at the end."""
    chunks = []
    while size:
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not readable([sock], remaining):
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
    """The endpoint's end: one question at a time, each with a deadline. A thread of its own reads every answer as
    it comes, so an answer that stalls half-way (its training process stopped, or swapped out) holds no render past
    its deadline, and answers that come after their asker gave up are read and dropped at once: they never fill the
    link and block the training process's spool thread."""

    def __init__(self, sock: socket.socket):
        self._sock = sock
        self._asking = threading.Lock()
        self._answered = threading.Condition()
        self._sequence = 0
        self._waiting_for = 0  # the sequence of the question being asked; 0: none
        self._answer: tuple[dict, bytes] | None = None
        self.closed = False
        threading.Thread(target=self._read_answers, name="neuron-exporter-link", daemon=True).start()

    def _read_answers(self) -> None:
        try:
            while True:
                document, body = read_answer(self._sock, None)
                with self._answered:
                    if document.get("sequence") == self._waiting_for:
                        self._answer = (document, body)
                        self._answered.notify_all()
        except (OSError, ValueError):
            pass
        with self._answered:
            self.closed = True
            self._answered.notify_all()

    def ask(self, kind: bytes, timeout: float) -> tuple[dict, bytes] | None:
        """The answer to ``kind``, or None if none came within ``timeout`` seconds or the link is closed."""
        with self._asking:
            with self._answered:
                if self.closed:
                    return None
                self._sequence = self._sequence % 0xFFFFFFFF + 1
                self._waiting_for, self._answer = self._sequence, None
            try:
                # Never blocks: with the training process stopped long enough to leave its end full of questions,
                # the question is not asked (no answer, as for a late one).
                sent = self._sock.send(REQUEST.pack(kind, self._sequence), socket.MSG_DONTWAIT)
            except BlockingIOError:
                sent = 0
            except OSError:
                self._close()
                return None
            with self._answered:
                if sent == REQUEST.size:
                    self._answered.wait_for(lambda: self._answer is not None or self.closed, timeout)
                elif sent:  # part of a question: the link is out of step for good
                    self.closed = True
                answer, self._answer, self._waiting_for = self._answer, None, 0
                return answer

    def _close(self) -> None:
        with self._answered:
            self.closed = True
            self._answered.notify_all()


def read_requests(sock: socket.socket) -> list[tuple[bytes, int]]:
    """The requests waiting on the training process's end (call when it is readable); ``LinkClosed`` at its end."""
    data = sock.recv(REQUEST.size * 64)
    if not data:
        raise LinkClosed("the node endpoint closed the link")
    # Requests are tiny and written whole; a partial one would mean a broken peer.
    if len(data) % REQUEST.size:
        raise LinkClosed("a partial request")
    return [REQUEST.unpack_from(data, offset) for offset in range(0, len(data), REQUEST.size)]


# -- the training process's end ------------------------------------------------------------------------------


class JobEndpointProcess:
    """Binds ``port`` (0: a free one) and starts the endpoint process on it, serving ``run_id`` only or, with
    ``every_run``, every run of the spool; raises ``OSError`` if the port is taken (another rank or the daemon
    serves the node)."""

    def __init__(
        self,
        options: Options,
        port: int,
        run_id: str,
        every_run: bool,
        web_config: WebConfig | None,
        autostart_dir: str,
    ):
        listener = bind_listener(options.addr, port)
        theirs = process = None
        try:
            self.link, theirs = socket.socketpair()
            self.port: int = listener.getsockname()[1]
            self.url = url_of(listener, options.addr, web_config)
            self._process = process = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    ENDPOINT_MAIN,
                    "--listen-fd",
                    str(listener.fileno()),
                    "--link-fd",
                    str(theirs.fileno()),
                ],
                pass_fds=(listener.fileno(), theirs.fileno()),
                env=_endpoint_environment(autostart_dir),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                start_new_session=True,
            )
            self.link.settimeout(SEND_TIMEOUT_SECONDS)
            send_answer(
                self.link,
                {
                    "sequence": 0,
                    "run_id": run_id,
                    "every_run": every_run,
                    "options": {**dataclasses.asdict(options), "port": self.port},
                },
            )
        except BaseException:
            if theirs is not None:
                self.link.close()
            if process is not None:  # it could not be given its configuration: it must not wait for it
                process.kill()
                process.wait()
            raise
        finally:
            listener.close()  # the endpoint process has its copy
            if theirs is not None:
                theirs.close()
        self._wake_reader, self._wake_writer = socket.socketpair()
        self._wake_writer.setblocking(False)
        self._started = time.monotonic()
        self.served = False  # it asked a question: it started and served a scrape

    def lived_seconds(self) -> float:
        return time.monotonic() - self._started

    def answer(self, timeout: float, answer: Callable[[bytes], tuple[dict, bytes]]) -> bool:
        """Wait up to ``timeout`` seconds for questions and answer each with ``answer(kind)``; False once the
        endpoint process is gone (the caller then lets another process serve, or binds again)."""
        ready = readable([self.link, self._wake_reader], timeout)
        if self._wake_reader in ready:
            self._wake_reader.recv(64)
        if self.link not in ready:
            return True
        try:
            for kind, sequence in read_requests(self.link):
                self.served = True
                document, body = answer(kind)
                send_answer(self.link, {"sequence": sequence, **document}, body)
        except OSError:
            return False
        return True

    def wake(self) -> None:
        """End a wait in ``answer`` (the spool thread is asked to stop)."""
        try:
            self._wake_writer.send(b"\0")
        except OSError:
            pass

    def stop(self) -> None:
        """Stop the endpoint process and free the port."""
        self.link.close()
        self._process.terminate()
        try:
            self._process.wait(STOP_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._wake_reader.close()
        self._wake_writer.close()

    def close_inherited_socket(self) -> None:
        """In a forked child: drop the copies of the link; the endpoint process stays the parent's."""
        for sock in (self.link, self._wake_reader, self._wake_writer):
            sock.close()


def _endpoint_environment(autostart_dir: str) -> dict[str, str]:
    """This process's environment without what would attach the endpoint process itself."""
    env = {key: value for key, value in os.environ.items() if key != AUTO_ENV}
    path = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != autostart_dir]
    if path:
        env["PYTHONPATH"] = os.pathsep.join(path)
    else:
        env.pop("PYTHONPATH", None)
    return env
