"""Fixtures of the node room."""

import pytest


@pytest.fixture
def daemons():
    started = []
    yield started.append
    for daemon in started:
        if daemon.process.poll() is None:
            daemon.process.kill()
            daemon.process.wait()
