"""``neuron-exporter serve`` started as a process for a test."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import urllib.parse
from pathlib import Path

from tests.support.paths import ROOT
from tests.support.processes import wait_until


def serve_command(spool: Path | str, *options: str, port: int = 0) -> list[str]:
    """The command line of ``neuron-exporter serve`` on loopback, serving ``spool``."""
    return [
        *[sys.executable, "-m", "neuron_exporter", "serve"],
        *["--addr", "127.0.0.1", "--port", str(port), "--spool-dir", str(spool)],
        *options,
    ]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Daemon:
    def __init__(self, tmp_path: Path, *args: str, env: dict[str, str] | None = None):
        self.log = tmp_path / f"daemon-{len(list(tmp_path.glob('daemon-*.log')))}.log"
        with open(self.log, "w") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "neuron_exporter", "serve", *args],
                env={"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT), **(env or {})},
                stderr=out,
            )
        found = wait_until(
            lambda: re.search(r"listening on (\S+)", self.log.read_text()) or self.process.poll(),
            timeout=60,
            what="the daemon to listen",
        )
        assert self.process.poll() is None, self.log.read_text()
        self.url = found.group(1)
        self.port = int(urllib.parse.urlsplit(self.url).port)

    def stop(self, signum: int = signal.SIGTERM) -> int:
        self.process.send_signal(signum)
        return self.process.wait(timeout=30)
