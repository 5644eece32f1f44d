"""``neuron-exporter diagnose`` as a client, on real sockets: it reads an endpoint over https with basic auth, and
against servers that misbehave every answer it cannot use is one line and exit 2, and ``--timeout`` bounds the
whole exchange however slowly the server sends."""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from neuron_exporter.web.http_server import metrics_server
from tests.support.diagnosis_page import diagnose
from tests.support.http import make_certificate

PAGE = b'{"format": 1, "ranks": []}'
OK_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"

Behaviour = Callable[[socket.socket, threading.Event], None]


def sends(data: bytes) -> Behaviour:
    return lambda conn, stop: conn.sendall(data)


def trickles(data: bytes) -> Behaviour:
    """A byte a second: ``data`` whole would take len(data) seconds."""

    def behave(conn: socket.socket, stop: threading.Event) -> None:
        for i in range(len(data)):
            if stop.wait(1.0):
                return
            conn.sendall(data[i : i + 1])

    return behave


def continues_for_ever(conn: socket.socket, stop: threading.Event) -> None:
    while not stop.wait(0.2):
        conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")


@contextlib.contextmanager
def hostile(behave: Behaviour, tls: ssl.SSLContext | None = None) -> Iterator[str]:
    """The URL of a server on 127.0.0.1 (over ``tls`` if given) that reads each request's head and then does
    ``behave``, until the context ends."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def handle(conn: socket.socket) -> None:
        with conn:
            try:
                if tls is not None:
                    conn = tls.wrap_socket(conn, server_side=True)
                head = b""
                while b"\r\n\r\n" not in head and (data := conn.recv(4096)):
                    head += data
                behave(conn, stop)
            except OSError:  # the client gave up
                pass

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"{'https' if tls else 'http'}://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        listener.close()


def redirects_to_itself(conn: socket.socket, stop: threading.Event) -> None:
    port = conn.getsockname()[1]
    conn.sendall(
        b"HTTP/1.1 302 Found\r\nLocation: http://127.0.0.1:%d/diagnosis?format=json\r\nContent-Length: 0\r\n\r\n" % port
    )


MISBEHAVIOURS = {
    "bad status line": (sends(b"HELLO WORLD\r\n\r\n"), "not a valid HTTP answer"),
    "binary junk": (sends(b"\x16\x03\x01\x00\xff" * 20), "not a valid HTTP answer"),
    "70 KB header line": (sends(OK_HEAD + b"X-Big: " + b"a" * 70_000 + b"\r\n\r\n" + PAGE), "not a valid HTTP answer"),
    "over 100 headers": (sends(OK_HEAD + b"X-Many: 1\r\n" * 101 + b"\r\n" + PAGE), "not a valid HTTP answer"),
    "bad chunk size": (sends(OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n" + PAGE), "chunks malformed"),
    "truncated chunked body": (
        sends(OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\n%x\r\n" % len(PAGE) + PAGE[:5]),
        "cut short",
    ),
    "truncated content-length body": (sends(OK_HEAD + b"Content-Length: 100\r\n\r\n" + PAGE), "cut short"),
    "nothing at all": (sends(b""), "closed connection without response"),
    "redirect loop": (redirects_to_itself, "HTTP 302 Found, redirected to http://127.0.0.1:"),
    "control characters in the reason": (sends(b"HTTP/1.1 500 \x1b[2Jgone\rX\r\n\r\n"), "HTTP 500 \\x1b[2Jgone"),
}


@pytest.mark.parametrize("behave, words", MISBEHAVIOURS.values(), ids=MISBEHAVIOURS)
def test_a_bad_answer_is_one_line_and_exit_2(behave, words):
    with hostile(behave) as url:
        result = diagnose(url, "--timeout", "20")
    assert result.returncode == 2 and result.stdout == "", result
    assert result.stderr.count("\n") == 1 and "internal error" not in result.stderr, result.stderr
    assert result.stderr.startswith(f"neuron-exporter diagnose: {url}: ") and words in result.stderr, result.stderr


SLOW = {
    "a byte a second": trickles(OK_HEAD + b"Content-Length: %d\r\n\r\n" % len(PAGE) + PAGE),  # over 60 s in all
    "a byte a second of body": lambda conn, stop: (
        conn.sendall(OK_HEAD + b"Content-Length: %d\r\n\r\n" % 60),
        trickles(b" " * 60)(conn, stop),
    ),
    "endless 100 continue": continues_for_ever,
    "silence": lambda conn, stop: stop.wait(120),
}


@pytest.fixture(scope="module")
def certificate(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tls")
    make_certificate(directory)
    return directory


@pytest.mark.parametrize("behave", SLOW.values(), ids=SLOW)
@pytest.mark.parametrize("scheme", ["http", "https"])
def test_the_timeout_bounds_the_whole_exchange(behave, scheme, certificate):
    tls, args = None, ["--timeout", "2"]
    if scheme == "https":
        tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        tls.load_cert_chain(certificate / "server.crt", certificate / "server.key")
        args += ["--cacert", str(certificate / "server.crt")]
    with hostile(behave, tls) as url:
        started = time.monotonic()
        result = diagnose(url, *args)
        took = time.monotonic() - started
    assert took < 30, took  # the server would take 60 s or for ever
    assert result.returncode == 2 and result.stdout == "", result
    assert result.stderr == f"neuron-exporter diagnose: {url}: timed out after 2 s\n"


def test_it_reads_an_endpoint_over_https_with_basic_auth(certificate, monkeypatch):
    bcrypt = pytest.importorskip("bcrypt", reason="basic auth needs the 'auth' extra (bcrypt)")
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()
    config = certificate / "web.yml"
    config.write_text(
        "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
        f"basic_auth_users:\n  prometheus: {hashed}\n"
    )
    document = {"format": 1, "ranks": []}
    server = metrics_server(lambda: b"", lambda: document, "127.0.0.1", 0, str(config)).start()
    try:
        cacert = ["--cacert", str(certificate / "server.crt"), "--format", "json"]
        monkeypatch.setenv("NEURON_EXPORTER_PASSWORD", "s3cret")
        result = diagnose(server.url, "--user", "prometheus", *cacert)
        assert result.returncode == 0 and json.loads(result.stdout)["ranks"] == [], result
        monkeypatch.setenv("NEURON_EXPORTER_PASSWORD", "wrong")
        result = diagnose(server.url, "--user", "prometheus", *cacert)
        assert (result.returncode, result.stderr) == (
            2,
            f"neuron-exporter diagnose: {server.url}: HTTP 401 Unauthorized\n",
        )
        result = diagnose(server.url, "--user", "prometheus", "--format", "json")  # the certificate is not trusted
        assert result.returncode == 2 and "CERTIFICATE_VERIFY_FAILED" in result.stderr, result
    finally:
        server.stop()
