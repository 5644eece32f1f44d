"""Simulated ranks for the spool, node-endpoint and daemon tests: real processes holding real rank files."""

from __future__ import annotations

import subprocess
import sys

from tests.support.paths import SCRIPTS

WRITER = SCRIPTS / "spool_writer.py"


class Writer:
    """A process that wrote rank files and stays alive (holding the ranks' locks) until stopped or killed."""

    def __init__(self, spool_dir, ranks: str, *args: str):
        self.process = subprocess.Popen(
            [sys.executable, str(WRITER), str(spool_dir), ranks, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        line = self.process.stdout.readline()
        if line.strip() != "ready":
            self.process.kill()
            raise RuntimeError(f"spool writer failed: {self.process.stderr.read()}")

    @property
    def pid(self) -> int:
        return self.process.pid

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            self.process.wait(timeout=30)

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, *exc) -> None:
        if self.process.poll() is None:
            self.kill()
