"""A stand-in for the EC2 instance metadata service (IMDSv2), a real HTTP server: ``PUT /latest/api/token`` with a
TTL header gives a token, ``GET /latest/meta-data/instance-id`` with that token the instance id. ``hold()`` makes it
keep every request unanswered until ``release()``, as a metadata service that does not answer."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TOKEN = "AQAEAFake-token-for-the-tests=="


class MetadataService:
    def __init__(self, instance_id: str = "i-0123456789abcdef0"):
        self.instance_id = instance_id
        self.requests: list[tuple[str, str]] = []  # (method, path) of every request, as it arrives
        self._released = threading.Event()
        self._released.set()
        service = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self, status: int, body: str) -> None:
                service.requests.append((self.command, self.path))
                service._released.wait(60)
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body.encode())

            def do_PUT(self) -> None:
                if self.path == "/latest/api/token" and self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                    self._answer(200, TOKEN)
                else:
                    self._answer(400, "")

            def do_GET(self) -> None:
                if self.headers.get("X-aws-ec2-metadata-token") != TOKEN:
                    self._answer(401, "")
                elif self.path == "/latest/meta-data/instance-id":
                    self._answer(200, service.instance_id)
                else:
                    self._answer(404, "")

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def hold(self) -> None:
        self._released.clear()

    def release(self) -> None:
        self._released.set()

    def __enter__(self) -> MetadataService:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.release()
        self.server.shutdown()
        self.server.server_close()
