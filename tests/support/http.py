"""HTTP clients for the web tests: a GET that returns any status, raw exchanges, TLS contexts."""

from __future__ import annotations

import base64
import socket
import ssl
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

BODY = b"# HELP demo_total A demo\n# TYPE demo_total counter\ndemo_total 1.0\n"


def get(url: str, context=None, auth: tuple[str, str] | None = None, headers=None):
    """(status, headers, body) of a GET, for any status."""
    request = urllib.request.Request(url, headers=headers or {})
    if auth is not None:
        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.headers, error.read()


def client_context(tls_files: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(tls_files / "server.crt"))


def raw_exchange(port: int, data: bytes) -> bytes:
    """Everything the server sends back to ``data`` until it closes the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def make_certificate(directory: Path, name: str = "server") -> bytes:
    """A self-signed certificate for 127.0.0.1 and localhost (``name``.crt, ``name``.key); returns it in DER form."""
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "1",
            "-keyout",
            str(directory / f"{name}.key"),
            "-out",
            str(directory / f"{name}.crt"),
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=IP:127.0.0.1,DNS:localhost",
        ],
        check=True,
        capture_output=True,
    )
    return ssl.PEM_cert_to_DER_cert((directory / f"{name}.crt").read_text())
