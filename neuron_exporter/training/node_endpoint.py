"""The training process's side of its job's node endpoint (``node/job_endpoint.py``): bind the port, start the
endpoint process with the bound socket, and answer its questions from the spool thread.

Binding here, not in the endpoint process, tells ``attach()`` at once whether this process holds the port, and which
port ``port=0`` picked. The endpoint process is a fresh interpreter (no fork of a training process, no torch) in a
session of its own, so a Ctrl-C in the terminal reaches the training script, which then stops it.
"""

from __future__ import annotations

import dataclasses
import os
import select
import socket
import subprocess
import sys
import time
from collections.abc import Callable

from ..config import AUTO_ENV, Options
from ..node.job_link import read_requests, send_answer
from ..web.connections import bind_listener
from ..web.http_server import url_of

STOP_TIMEOUT_SECONDS = 5.0
SEND_TIMEOUT_SECONDS = 5.0
# The folder holding the neuron_exporter this process imported, searched last: an installed package is found as
# usual, and a source checkout that the training script put on its path is found too.
PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENDPOINT_MAIN = (
    f"import sys; sys.path.append({PACKAGE_PARENT!r}); "
    "from neuron_exporter.node.job_endpoint import main; sys.exit(main())"
)


class NodeEndpointProcess:
    """Raises ``OSError`` if the port is taken (another rank or the daemon serves the node)."""

    def __init__(self, options: Options, run_id: str, tls: bool, autostart_dir: str):
        listener = bind_listener(options.addr, options.port)
        theirs = None
        try:
            self.link, theirs = socket.socketpair()
            self.port: int = listener.getsockname()[1]
            self.url = url_of(listener, options.addr, tls)
            self._process = subprocess.Popen(
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
                {"sequence": 0, "run_id": run_id, "options": {**dataclasses.asdict(options), "port": self.port}},
            )
        except BaseException:
            if theirs is not None:
                self.link.close()
            raise
        finally:
            listener.close()  # the endpoint process has its copy
            if theirs is not None:
                theirs.close()
        self._wake_reader, self._wake_writer = socket.socketpair()
        self._wake_writer.setblocking(False)
        self._started = time.monotonic()

    def lived_seconds(self) -> float:
        return time.monotonic() - self._started

    def answer(self, timeout: float, answer: Callable[[bytes], tuple[dict, bytes]]) -> bool:
        """Wait up to ``timeout`` seconds for questions and answer each with ``answer(kind)``; False once the
        endpoint process is gone (the caller then lets another process serve, or binds again)."""
        ready = select.select([self.link, self._wake_reader], [], [], timeout)[0]
        if self._wake_reader in ready:
            self._wake_reader.recv(64)
        if self.link not in ready:
            return True
        try:
            for kind, sequence in read_requests(self.link):
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
