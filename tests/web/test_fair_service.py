"""Fair service: however clients use their connections (pipelining thousands of requests they never read, scraping
back to back by the dozen, asking for a slow page), a scraper is answered by the next renders, not after them.

The load runs in a process of its own (tests/scripts/http_load.py), so it takes none of the endpoint's GIL. Renders
are counted, and a scrape must be answered by one of the first renders that could serve it: a count, not a time.
"""

from __future__ import annotations

import json
import re
import select
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request

import pytest

from neuron_exporter.web import connections, http_server
from neuron_exporter.web.admission import MAX_CONNECTIONS
from neuron_exporter.web.connections import ROOM_BURST, ROOM_PER_SECOND, Connections, bind_listener
from neuron_exporter.web.http_messages import TEXT, Response
from neuron_exporter.web.lanes import FairQueue
from tests.support.daemon import Daemon
from tests.support.http import BODY, get
from tests.support.paths import ROOT
from tests.support.processes import wait_until, xla_env

LOAD = ROOT / "tests" / "scripts" / "http_load.py"
# A render serves the requests that came before it started; the one running when a scrape comes started before it.
# So the scrape is answered by the second render after it came, or the third if that one began as it came.
MOST_RENDERS_TO_WAIT = 3


class Load:
    """tests/scripts/http_load.py against ``port``, on while in the ``with`` block; then ``answered``, ``sent``."""

    def __init__(self, kind: str, port: int, *options: str):
        self.process = subprocess.Popen(
            [sys.executable, str(LOAD), kind, str(port), "--seconds", "300", *options],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.answered = self.sent = 0

    def __enter__(self) -> Load:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        assert line == "ready\n", line
        return self

    def __exit__(self, *exc) -> None:
        out, _ = self.process.communicate(timeout=300)
        found = re.search(r"answered (\d+) of (\d+)", out)
        assert found, out
        self.answered, self.sent = int(found.group(1)), int(found.group(2))


class CountedRenders:
    """A /metrics source that says which render it is."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> bytes:
        self.count += 1
        return b"# HELP demo_renders_total Renders\n# TYPE demo_renders_total counter\n" + (
            f"demo_renders_total {self.count}\n".encode()
        )


def render_number(url: str) -> int:
    with urllib.request.urlopen(url, timeout=60) as response:
        return int(re.search(rb"demo_renders_total (\d+)", response.read()).group(1))


@pytest.mark.parametrize("kind", ["pipeline", "polite"])
def test_a_scrape_is_answered_by_the_next_renders_under_load(server, monkeypatch, kind):
    """8 connections each pipelining 2,000 ``HEAD /metrics`` and never reading, or 64 clients scraping back to back:
    a scrape waits for no one's requests but its own render."""
    # Renders a second apart and no burst of them: a scrape taken to its render within a second meets the bound.
    monkeypatch.setattr(http_server, "RENDERS_PER_SECOND", 1.0)
    monkeypatch.setattr(http_server, "RENDERS_BURST", 1)
    renders = CountedRenders()
    s = server(renders)
    with Load(kind, s.port) as load:
        for _ in range(3):
            before = renders.count
            assert render_number(s.url) <= before + MOST_RENDERS_TO_WAIT
    if kind == "pipeline":
        assert load.answered < load.sent  # the scrapes were answered while the pipelined requests waited


def test_the_daemon_answers_a_scrape_while_8_connections_pipeline(tmp_path):
    daemon = Daemon(tmp_path, "--addr", "127.0.0.1", "--port", "0", "--spool-dir", str(tmp_path / "spool"))
    try:
        with Load("pipeline", daemon.port) as load:
            for _ in range(3):
                assert get(daemon.url)[0] == 200
    finally:
        assert daemon.stop() == 0
    assert load.answered < load.sent


CROWDS = {"idle": (), "silent": ("--silent",)}


def scrapes_on_new_connections(url: str, count: int = 30) -> list[int]:
    return [get(url)[0] for _ in range(count)]


@pytest.mark.parametrize("crowd", list(CROWDS))
def test_300_addresses_holding_a_connection_each_never_lock_a_new_scraper_out(server, crowd):
    """One connection for each of 300 addresses (idle after an answer, or silent), more than the endpoint holds,
    opened again whenever the endpoint closes one: every scrape on a new connection is answered."""
    s = server()
    with Load("crowd", s.port, *CROWDS[crowd]) as load:
        assert scrapes_on_new_connections(s.url) == [200] * 30
    assert load.sent > 300  # the endpoint closed some to make room, and they came back


def test_a_crowd_that_reconnects_at_once_is_accepted_no_faster_than_the_pace_for_making_room(server):
    """The crowd opens a connection again the moment it loses one: unpaced, the endpoint accepted and closed about
    2,000 a second, each taking the interpreter lock from a training thread beside it."""
    s = server()
    start = time.monotonic()
    with Load("crowd", s.port) as load:
        assert scrapes_on_new_connections(s.url) == [200] * 30
    elapsed = time.monotonic() - start
    # Past its first 300, the crowd opens a connection only for one the endpoint closed, each after a paced accept.
    assert 300 < load.sent <= 300 + ROOM_BURST + ROOM_PER_SECOND * elapsed, elapsed


def flood(port: int, count: int, first: int = 0) -> list[socket.socket]:
    """``count`` silent connections, each from an address of its own (127.0.1.1 on, past the ``first``)."""
    addresses = (f"127.0.{1 + n // 250}.{1 + n % 250}" for n in range(first, first + count))
    return [socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(a, 0)) for a in addresses]


def all_readable(socks: list) -> bool:
    poll = select.poll()
    for sock in socks:
        poll.register(sock, select.POLLIN)
    return len(poll.poll(0)) == len(socks)


def counted_reservations(connections_: Connections, monkeypatch) -> list[float]:
    """The waits of the accepts that made room on ``connections_``, as they come."""
    pacer = connections_._room
    reserve, waits = pacer.reserve, []
    monkeypatch.setattr(pacer, "reserve", lambda: waits.append(reserve()) or waits[-1])
    return waits


def test_once_a_flood_has_closed_its_connections_new_ones_wait_for_no_pace(server, monkeypatch):
    """A flood from hundreds of addresses fills the endpoint and has its accepts paced; once the flood closes its
    connections there is room again, and new connections make none: they wait for no pace (an hour, here)."""
    monkeypatch.setattr(connections, "ROOM_PER_SECOND", 1 / 3600)
    monkeypatch.setattr(connections, "ROOM_BURST", 1)
    s = server()
    made_room = counted_reservations(s._connections, monkeypatch)
    crowd = flood(s.port, MAX_CONNECTIONS + 2)  # the last two make room: the first at once, the second past an hour
    wait_until(lambda: len(made_room) == 2, what="the flood's last two connections to make room")
    assert made_room[1] > 60  # accepts wait for the pace now
    crowd += flood(s.port, 1, first=MAX_CONNECTIONS + 2)  # waits in the kernel's accept queue meanwhile
    for sock in crowd:
        sock.close()
    assert scrapes_on_new_connections(s.url, 3) == [200] * 3
    assert len(made_room) == 2  # neither the flood's last connection nor the scrapes made room


def test_peers_that_closed_while_the_endpoint_was_busy_free_their_room_before_any_is_made(monkeypatch):
    """The flood closes its connections while the endpoint is busy accepting one: the connections it accepts then
    find the room the flood left, and make none."""
    monkeypatch.setattr(connections, "ROOM_PER_SECOND", 1 / 3600)
    monkeypatch.setattr(connections, "ROOM_BURST", 1)
    hold, held, release = threading.Event(), threading.Event(), threading.Event()

    def no_tls():  # asked at each burst of accepts: while ``hold`` is set, the loop waits here for ``release``
        if hold.is_set():
            held.set()
            assert release.wait(60)

    ok = Response(200, b"ok\n", TEXT)
    served = Connections(lambda request: ok, bind_listener("127.0.0.1", 0), no_tls)
    port = served._listener.getsockname()[1]
    served.start()
    made_room = counted_reservations(served, monkeypatch)
    crowd, late = flood(port, MAX_CONNECTIONS + 1), []  # the last one makes room: the pace's burst is spent
    try:
        wait_until(lambda: made_room == [0.0], what="the flood's last connection to make room")
        hold.set()
        late = flood(port, 2, first=MAX_CONNECTIONS + 1)
        assert held.wait(60)  # the loop is about to accept them, and will not look at its connections meanwhile
        for sock in crowd:
            sock.close()
        server_side = [connection.sock for connection in served._admission]
        wait_until(lambda: all_readable(server_side), what="the endpoint's sockets to see their peers close")
        release.set()
        for sock in late:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert sock.recv(65536).startswith(b"HTTP/1.1 200 OK")
        assert made_room == [0.0]  # the two accepted after the flood made no room
    finally:
        release.set()
        for sock in crowd + late:
            sock.close()
        served.stop()


@pytest.mark.parametrize("crowd", list(CROWDS))
def test_the_daemon_answers_new_scrapers_while_300_addresses_hold_a_connection_each(tmp_path, crowd):
    daemon = Daemon(tmp_path, "--addr", "127.0.0.1", "--port", "0", "--spool-dir", str(tmp_path / "spool"))
    try:
        with Load("crowd", daemon.port, *CROWDS[crowd]):
            assert scrapes_on_new_connections(daemon.url) == [200] * 30
    finally:
        assert daemon.stop() == 0


def test_two_clients_on_a_slow_page_never_delay_metrics_and_share_one_render(server, monkeypatch):
    monkeypatch.setattr(http_server, "PAGE_INTERVAL_SECONDS", 3600.0)  # so the render is shared whenever they come
    entered, release = threading.Event(), threading.Event()
    renders: list[dict] = []

    def page(query):
        renders.append(query)
        entered.set()
        assert release.wait(60)
        return b"the diagnosis\n", TEXT

    s = server(pages={"/diagnosis": page})
    base = s.url.removesuffix("/metrics")
    asking = [socket.create_connection(("127.0.0.1", s.port), timeout=60) for _ in range(2)]
    try:
        for n, sock in enumerate(asking):
            sock.sendall(f"GET /diagnosis?x={n} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        assert entered.wait(60)
        for _ in range(3):
            status, _, body = get(s.url)
            assert (status, body) == (200, BODY)
        assert not release.is_set()  # the page was still rendering all along
        release.set()
        for sock in asking:
            reply = b"".join(iter(lambda sock=sock: sock.recv(65536), b""))
            assert reply.startswith(b"HTTP/1.1 200 OK") and reply.endswith(b"the diagnosis\n")
    finally:
        release.set()
        for sock in asking:
            sock.close()
    assert get(f"{base}/diagnosis?x=3")[2] == b"the diagnosis\n"
    assert renders == [{}]  # once for every query string
    assert get(f"{base}/diagnosis?format=json&x=4")[0] == 200
    assert renders == [{}, {"format": ["json"]}]  # the one parameter that picks another form


def test_a_fair_queue_takes_each_client_in_turn():
    queue: FairQueue[str] = FairQueue()
    for item in ("a1", "a2", "a3"):
        queue.put("a", item)
    queue.put("b", "b1")
    queue.put("c", "c1")
    queue.put("b", "b2")
    assert [queue.get() for _ in range(len(queue))] == ["a1", "b1", "c1", "a2", "b2", "a3"]


@pytest.mark.training
@pytest.mark.parametrize(
    "node_view, load_kind",
    [("true", "pipeline"), ("false", "pipeline"), ("true", "crowd")],
    ids=["job endpoint", "rank endpoint", "job endpoint, 300 addresses"],
)
def test_a_training_job_answers_a_scrape_while_8_connections_pipeline(tmp_path, node_view, load_kind):
    """A job's node endpoint (a process of its own, asking the training process for its exposition) and a rank's
    own endpoint (in the training process); the job's endpoint again with 300 addresses holding a connection
    each, every scrape on a new connection."""
    job = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "scripts" / "endpoint_job.py"), "0", str(tmp_path / "spool")],
        env=xla_env(NEURON_EXPORTER_RUN_ID="fair-service", NEURON_EXPORTER_NODE_VIEW=node_view),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        url = json.loads(job.stdout.readline())["url"]
        with Load(load_kind, urllib.parse.urlsplit(url).port) as load:
            for _ in range(30 if load_kind == "crowd" else 3):
                status, _, body = get(url)
                assert status == 200 and b"training_steps_total" in body
        job.communicate(input="", timeout=120)
        assert job.returncode == 0
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    if load_kind == "crowd":
        assert load.sent > 300  # the endpoint closed some to make room, and they came back
    else:
        assert load.answered < load.sent
