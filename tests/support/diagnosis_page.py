"""A stand-in endpoint that answers every GET with one body (a /diagnosis page), and ``neuron-exporter diagnose``
run against it."""

from __future__ import annotations

import contextlib
import http.server
import os
import subprocess
import sys
import threading
from collections.abc import Iterator

from tests.support.paths import ROOT


class Page(http.server.BaseHTTPRequestHandler):
    body = b""

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def serving(body: bytes) -> Iterator[str]:
    """The URL of a server answering ``body`` to every GET, while the context lasts."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), type("OnePage", (Page,), {"body": body}))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def diagnose(url: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "neuron_exporter", "diagnose", url, *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
