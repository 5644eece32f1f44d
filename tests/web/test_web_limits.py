"""The endpoint stays answerable under many clients: a stalled or trickling connection costs a socket until its
deadline, never a thread; open connections and threads are bounded; a burst of scrapers is answered."""

from __future__ import annotations

import http.client
import random
import re
import selectors
import socket
import threading

import pytest

from neuron_exporter.web import admission, connections
from neuron_exporter.web.admission import MAX_CONNECTIONS, MAX_PER_CLIENT, WRITING
from neuron_exporter.web.http_server import LOGIN_WORKERS, METRICS_WORKERS, PAGE_WORKERS
from tests.support.http import BODY, client_context, raw_exchange
from tests.support.processes import wait_until

AUTH = {"Authorization": "Basic cHJvbWV0aGV1czpzM2NyZXQ="}  # prometheus:s3cret, as in tls_files


def connection_to(s, tls_files=None, timeout: float = 10.0, source: str = "127.0.0.1") -> http.client.HTTPConnection:
    if tls_files is None:
        return http.client.HTTPConnection("127.0.0.1", s.port, timeout=timeout, source_address=(source, 0))
    return http.client.HTTPSConnection(
        "127.0.0.1", s.port, timeout=timeout, context=client_context(tls_files), source_address=(source, 0)
    )


def scrape(s, tls_files=None, timeout: float = 10.0, source: str = "127.0.0.1") -> tuple[int, bytes]:
    connection = connection_to(s, tls_files, timeout, source)
    try:
        connection.request("GET", "/metrics", headers=AUTH if tls_files else {})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def writing(s) -> int:
    """How many of the server's connections are writing a response."""
    return sum(connection.state == WRITING for connection in list(s._connections._admission))


def closed_by_server(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True


@pytest.mark.parametrize("tls", [False, True], ids=["http", "https"])
def test_500_stalled_connections_leave_threads_bounded_and_a_scrape_answered(server, tls_files, tls):
    before = threading.active_count()
    s = server(web_config=tls_files / "web.yml") if tls else server()
    # A partial request line, or for TLS the first bytes of a ClientHello: then nothing, for as long as it takes.
    partial = b"\x16\x03\x01\x02\x00\x01" if tls else b"GET /metrics HTTP/1.1\r\nHost: loc"
    stalled, most_threads = [], 0
    scraper = connection_to(s, tls_files if tls else None)  # kept alive: connected before the attack
    scraper.request("GET", "/metrics", headers=AUTH if tls else {})
    assert scraper.getresponse().read() == BODY
    try:
        for n in range(500):
            sock = socket.create_connection(("127.0.0.1", s.port), timeout=10)
            sock.sendall(partial)
            stalled.append(sock)
            if n % 20 == 0:
                most_threads = max(most_threads, threading.active_count())
        assert scrape(s, tls_files if tls else None, timeout=5) == (200, BODY)  # answered within a few seconds
        scraper.request("GET", "/metrics", headers=AUTH if tls else {})  # its connection was spared
        assert scraper.getresponse().read() == BODY
        most_threads = max(most_threads, threading.active_count())
        workers = METRICS_WORKERS + PAGE_WORKERS + 2 * LOGIN_WORKERS
        assert most_threads - before <= 1 + workers  # the loop thread and the workers, whatever the clients do
        # The server closed the connections that waited longest, to keep at most MAX_PER_CLIENT of the address open.
        wait_until(
            lambda: sum(map(closed_by_server, stalled)) >= len(stalled) - MAX_PER_CLIENT,
            what="the oldest stalled connections to be closed",
        )
    finally:
        scraper.close()
        for sock in stalled:
            sock.close()


def test_a_trickling_client_is_closed_at_its_head_deadline(server, monkeypatch):
    monkeypatch.setattr(connections, "HEAD_TIMEOUT_SECONDS", 1.0)
    s = server()
    request = b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nUser-Agent: " + b"x" * 200 + b"\r\n\r\n"
    closed = threading.Event()
    with socket.create_connection(("127.0.0.1", s.port), timeout=60) as sock:

        def read():
            try:
                sock.recv(65536)  # nothing comes but the end of the connection
            except OSError:
                pass
            closed.set()

        reader = threading.Thread(target=read)
        reader.start()
        sent = 0
        # One byte every 50 ms: every read of the server finishes at once, the head never does.
        while sent < len(request) and not closed.wait(0.05):
            try:
                sock.send(request[sent : sent + 1])
            except OSError:
                break
            sent += 1
        assert closed.wait(30)
        reader.join()
    assert sent < len(request)


@pytest.mark.parametrize("tls", [False, True], ids=["http", "https"])
def test_a_silent_connection_is_closed_at_its_head_deadline(server, tls_files, monkeypatch, tls):
    monkeypatch.setattr(connections, "HEAD_TIMEOUT_SECONDS", 0.5)
    s = server(web_config=tls_files / "web.yml") if tls else server()
    with socket.create_connection(("127.0.0.1", s.port), timeout=30) as sock:
        assert sock.recv(1) == b""


def test_an_idle_kept_alive_connection_is_closed_after_the_idle_timeout(server, monkeypatch):
    monkeypatch.setattr(connections, "IDLE_TIMEOUT_SECONDS", 0.5)
    s = server()
    with socket.create_connection(("127.0.0.1", s.port), timeout=30) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        reply = b""
        while not reply.endswith(BODY):
            reply += sock.recv(65536)
        assert reply.startswith(b"HTTP/1.1 200 OK") and b"Connection: close" not in reply
        assert sock.recv(1) == b""


@pytest.mark.parametrize("tls", [False, True], ids=["http", "https"])
def test_200_concurrent_scrapers_are_all_answered(server, tls_files, tls):
    s = server(web_config=tls_files / "web.yml") if tls else server()
    scrapers = 200
    start = threading.Barrier(scrapers)
    results = []

    def one(source: str):
        start.wait()
        try:
            results.append(scrape(s, tls_files if tls else None, timeout=60, source=source))
        except Exception as error:  # noqa: BLE001 - reported below
            results.append(repr(error))

    # From four addresses, 50 each: within an address's share of the connections.
    threads = [threading.Thread(target=one, args=(f"127.0.0.{2 + n % 4}",)) for n in range(scrapers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [(200, BODY)] * scrapers


def test_a_client_that_does_not_read_its_response_holds_no_worker_and_is_reset(server, monkeypatch):
    monkeypatch.setattr(connections, "WRITE_TIMEOUT_SECONDS", 0.5)
    big = BODY * 200_000  # megabytes: more than the socket buffers hold
    s = server(lambda: big)
    with socket.create_connection(("127.0.0.1", s.port), timeout=30) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        assert scrape(s, timeout=30) == (200, big)  # answered while the slow reader has read nothing
        wait_until(lambda: writing(s) == 0, what="the unread response to be given up")
        with pytest.raises(ConnectionResetError):  # reset: the kernel keeps none of what it had not sent
            while sock.recv(1 << 20):
                pass


def test_a_client_refused_too_often_is_not_read_and_others_are_served(server, monkeypatch):
    monkeypatch.setattr(connections, "REFUSALS_BURST", 5)
    monkeypatch.setattr(connections, "REFUSAL_REFILL_SECONDS", 3600.0)
    s = server()
    kept = connection_to(s)  # a scraper on the same address, connected before
    kept.request("GET", "/metrics")
    assert kept.getresponse().read() == BODY
    refused = connection_to(s)
    for _ in range(5):  # the burst of refusals: 404s, 401s, 429s alike
        refused.request("GET", "/nope")
        response = refused.getresponse()
        assert (response.status, response.read()) == (404, b"Not Found: see /metrics\n")
    with socket.create_connection(("127.0.0.1", s.port), timeout=10) as parked:
        parked.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        other = http.client.HTTPConnection("127.0.0.1", s.port, timeout=10, source_address=("127.0.0.2", 0))
        other.request("GET", "/metrics")  # another client, connected after the parked one: served
        assert other.getresponse().read() == BODY
        kept.request("GET", "/metrics")  # and the kept-alive connection that was never refused
        assert kept.getresponse().read() == BODY
        parked.setblocking(False)
        with pytest.raises(BlockingIOError):
            parked.recv(1)  # accepted, never read: no answer
    for connection in (kept, refused, other):
        connection.close()


def test_a_paused_client_is_answered_when_its_rate_allows(server, monkeypatch):
    monkeypatch.setattr(connections, "REFUSALS_BURST", 1)
    monkeypatch.setattr(connections, "REFUSAL_REFILL_SECONDS", 0.2)
    s = server()
    # Pipelined: after the first refusal the connection is paused; the rest wait in its buffer, unread.
    reply = raw_exchange(
        s.port,
        b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n" * 3 + b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    assert re.findall(rb"HTTP/1.1 (\d+)", reply) == [b"404", b"404", b"404", b"200"] and reply.endswith(BODY)
    assert scrape(s) == (200, BODY)  # a new connection of the paused client: parked at first, then answered


def test_past_the_limit_the_crowded_address_loses_its_own_connections(server, monkeypatch):
    monkeypatch.setattr(admission, "MAX_CONNECTIONS", 8)
    s = server()
    other = socket.create_connection(("127.0.0.1", s.port), timeout=10, source_address=("127.0.0.2", 0))
    other.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # the oldest connection, still waiting for its head
    crowd = []
    try:
        for _ in range(12):
            sock = socket.create_connection(("127.0.0.1", s.port), timeout=10)
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
            crowd.append(sock)
        wait_until(lambda: sum(map(closed_by_server, crowd)) >= len(crowd) + 1 - 8, what="room to be made")
        other.setblocking(True)
        other.sendall(b"Connection: close\r\n\r\n")
        reply = b"".join(iter(lambda: other.recv(65536), b""))
        assert reply.startswith(b"HTTP/1.1 200 OK") and reply.endswith(BODY)
    finally:
        other.close()
        for sock in crowd:
            sock.close()


@pytest.mark.parametrize("tls", [False, True], ids=["http", "https"])
def test_a_large_response_arrives_whole_on_a_kept_alive_connection(server, tls_files, tls):
    big = BODY * 30_000  # 2 MB: written in chunks as the socket takes them, its head apart
    s = server(lambda: big, web_config=tls_files / "web.yml") if tls else server(lambda: big)
    connection = connection_to(s, tls_files if tls else None)
    try:
        for method in ("GET", "HEAD", "GET"):
            connection.request(method, "/metrics", headers=AUTH if tls else {})
            response = connection.getresponse()
            assert response.read() == (big if method == "GET" else b"")
            assert response.getheader("Content-Length") == str(len(big))
    finally:
        connection.close()


def test_past_the_limit_connections_whose_responses_are_not_read_make_room(server, monkeypatch):
    # Every slot holds a response its client does not read: a new client still gets in, at their expense.
    monkeypatch.setattr(admission, "MAX_CONNECTIONS", 8)
    big = BODY * 300_000  # 20 MB: more than the kernel's buffers on both sides take
    s = server(lambda: big)
    crowd = []
    try:
        for _ in range(8):
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect(("127.0.0.1", s.port))
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            crowd.append(sock)
        wait_until(lambda: writing(s) == 8, what="eight responses waiting to be read")
        other = socket.create_connection(("127.0.0.1", s.port), timeout=10, source_address=("127.0.0.2", 0))
        with other:
            other.sendall(b"HEAD /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert b"".join(iter(lambda: other.recv(65536), b"")).startswith(b"HTTP/1.1 200 OK")
    finally:
        for sock in crowd:
            sock.close()


class PipeliningCrowd:
    """``size`` connections from ``address``, each keeping about 50 ``GET /metrics`` pipelined and reading their
    answers, from a thread of its own until ``stop()``: every connection busy all the time."""

    REQUEST = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"

    def __init__(self, port: int, size: int, address: str = "127.0.0.1"):
        self.answering: set[socket.socket] = set()  # connections that got an answer
        self._selector = selectors.DefaultSelector()
        self._stopping = threading.Event()
        for _ in range(size):
            sock = socket.socket()
            sock.bind((address, 0))
            sock.connect(("127.0.0.1", port))
            sock.setblocking(False)
            sock.send(self.REQUEST * 50)  # 1.6 kB: the socket buffer takes it whole
            self._selector.register(sock, selectors.EVENT_READ, [50, b""])  # [requests not answered, last bytes]
        self._thread = threading.Thread(target=self._pump)
        self._thread.start()

    def _pump(self) -> None:
        marker = b"HTTP/1.1 200"
        while not self._stopping.is_set():
            for key, _ in self._selector.select(0.1):
                sock, state = key.fileobj, key.data
                try:
                    data = sock.recv(1 << 20)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if not data:  # closed by the server
                    self._selector.unregister(sock)
                    sock.close()
                    continue
                self.answering.add(sock)
                seen = state[1] + data  # an answer's first line may come in two reads
                state[0] -= seen.count(marker)
                state[1] = seen[-(len(marker) - 1) :]
                if state[0] < 10:
                    try:
                        state[0] += sock.send(self.REQUEST * 40) // len(self.REQUEST)
                    except OSError:
                        pass

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join()
        for key in list(self._selector.get_map().values()):
            key.fileobj.close()
        self._selector.close()


def test_an_address_pipelining_on_300_connections_costs_no_other_address_a_connection(server):
    s = server()
    kept = http.client.HTTPConnection("127.0.0.1", s.port, timeout=10, source_address=("127.0.0.2", 0))
    kept.request("GET", "/metrics")  # a scraper that keeps its connection alive, connected before the crowd
    assert kept.getresponse().read() == BODY
    crowd = PipeliningCrowd(s.port, MAX_CONNECTIONS + 44)
    results = []
    try:
        wait_until(lambda: len(crowd.answering) >= MAX_PER_CLIENT, what="the crowd to be answered")
        for _ in range(10):  # new connections of the scraper's address while every connection of the crowd is busy
            connection = http.client.HTTPConnection("127.0.0.1", s.port, timeout=10, source_address=("127.0.0.2", 0))
            try:
                connection.request("GET", "/metrics", headers={"Connection": "close"})
                response = connection.getresponse()
                results.append((response.status, response.read()))
            except OSError as error:  # reset, or closed before an answer
                results.append(repr(error))
            finally:
                connection.close()
        kept.request("GET", "/metrics")
        assert kept.getresponse().read() == BODY
        assert s._connections._admission.count("127.0.0.1") <= MAX_PER_CLIENT
    finally:
        crowd.stop()
        kept.close()
    assert results == [(200, BODY)] * 10


def test_when_every_address_has_as_many_the_oldest_idle_connection_makes_room(server, monkeypatch):
    # One connection for each of four addresses fills the endpoint: a fifth address is answered all the same, at
    # the cost of the oldest idle connection (the first address's), whose client opens a new one when it needs it.
    monkeypatch.setattr(admission, "MAX_CONNECTIONS", 4)
    s = server()
    kept = [connection_to(s, source=f"127.0.0.{n}") for n in range(2, 6)]
    try:
        for connection in kept:
            connection.request("GET", "/metrics")
            assert connection.getresponse().read() == BODY
        assert scrape(s, source="127.0.0.6") == (200, BODY)
        wait_until(lambda: closed_by_server(kept[0].sock), what="the oldest idle connection to be closed")
        for connection in kept[1:]:
            assert not closed_by_server(connection.sock)
            connection.sock.setblocking(True)
            connection.request("GET", "/metrics")
            assert connection.getresponse().read() == BODY
    finally:
        for connection in kept:
            connection.close()


def test_when_every_address_has_as_many_at_work_a_newcomer_is_refused(server, monkeypatch):
    monkeypatch.setattr(admission, "MAX_CONNECTIONS", 4)
    big = BODY * 300_000  # 20 MB: more than the kernel's buffers on both sides take, so each stays at work
    s = server(lambda: big)
    crowd = []
    try:
        for n in range(2, 6):
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.bind((f"127.0.0.{n}", 0))
            sock.connect(("127.0.0.1", s.port))
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            crowd.append(sock)
        wait_until(lambda: writing(s) == 4, what="four responses waiting to be read")
        with socket.create_connection(("127.0.0.1", s.port), timeout=10, source_address=("127.0.0.6", 0)) as new:
            new.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            try:
                assert new.recv(65536) == b""  # refused: closed unanswered
            except ConnectionResetError:
                pass
        assert writing(s) == 4  # none of theirs was closed for it
    finally:
        for sock in crowd:
            sock.close()


def test_the_admission_knows_the_most_any_address_holds_without_a_scan():
    rng = random.Random(3)
    table: admission.Admission[int] = admission.Admission()
    opened: dict[int, str] = {}
    for n in range(5000):
        if opened and rng.random() < 0.45:
            connection = rng.choice(list(opened))
            table.remove(opened.pop(connection), connection)
        else:
            opened[n] = client = f"10.0.0.{rng.randrange(12)}"
            table.add(client, n)
        held = [table.count(client) for client in set(opened.values())]
        assert table._most == max(held, default=0) and len(table) == len(opened)
