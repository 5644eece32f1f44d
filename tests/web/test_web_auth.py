"""Basic auth costs a guessing client more than it costs the job: bcrypt runs a bounded number of times, one at a
time, the same for an unknown user as for a wrong password; every method and path is behind it."""

from __future__ import annotations

import base64
import collections
import http.client
import itertools
import threading
import types
from pathlib import Path

import pytest

from neuron_exporter.web import basic_auth, connections
from neuron_exporter.web.web_config import load_web_config
from tests.support.http import BODY, get
from tests.support.processes import wait_until

bcrypt = pytest.importorskip("bcrypt", reason="basic auth needs the 'auth' extra (bcrypt)")

USER, PASSWORD = "prometheus", "s3cret"


def web_config(directory: Path, cost: int = 4, users: dict[str, str] | None = None) -> Path:
    """A web config (no TLS) with ``users`` (name -> password), hashed at ``cost``."""
    users = users or {USER: PASSWORD}
    lines = [
        f"  {name}: {bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=cost)).decode()}"
        for name, password in users.items()
    ]
    path = directory / "web.yml"
    path.write_text("basic_auth_users:\n" + "\n".join(lines) + "\n")
    return path


def authorization(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


@pytest.fixture
def count_checks(monkeypatch):
    """Call it after loading the config (which checks each hash once): every bcrypt check from then on, as
    ``costs`` (of the hashes checked) and ``most_at_once``."""

    def start():
        record = types.SimpleNamespace(costs=[], running=0, most_at_once=0)
        lock = threading.Lock()
        real = bcrypt.checkpw

        def counting(password, hashed):
            with lock:
                record.costs.append(int(hashed[4:6]))
                record.running += 1
                record.most_at_once = max(record.most_at_once, record.running)
            try:
                return real(password, hashed)
            finally:
                with lock:
                    record.running -= 1

        monkeypatch.setattr(bcrypt, "checkpw", counting)
        return record

    return start


def request(
    connection: http.client.HTTPConnection, auth: tuple[str, str] | None, method: str = "GET", path: str = "/metrics"
) -> tuple[int, bytes, http.client.HTTPResponse]:
    connection.request(method, path, headers=authorization(*auth) if auth else {})
    response = connection.getresponse()
    return response.status, response.read(), response


def test_a_wrong_password_flood_is_rate_limited_and_a_logged_in_scraper_keeps_scraping(
    server, tmp_path, count_checks, monkeypatch
):
    monkeypatch.setattr(basic_auth, "CLIENT_REFILL_SECONDS", 3600.0)  # no refill during the test: exact counts
    monkeypatch.setattr(connections, "REFUSALS_BURST", 10**6)  # this test is about bcrypt; see test_web_limits.py
    s = server(web_config=web_config(tmp_path, cost=6))
    checks = count_checks()
    scraper = http.client.HTTPConnection("127.0.0.1", s.port, timeout=30)  # logs in first, kept alive
    assert request(scraper, (USER, PASSWORD))[0] == 200
    assert len(checks.costs) == 1
    checks.costs.clear()

    threads, attempts = 16, 40
    statuses: collections.Counter[int] = collections.Counter()
    lock = threading.Lock()
    start = threading.Barrier(threads)

    def guess(thread: int):
        start.wait()
        connection = None
        for attempt in range(attempts):
            connection = connection or http.client.HTTPConnection("127.0.0.1", s.port, timeout=30)
            status, _, response = request(connection, (USER, f"guess-{thread}-{attempt}"))
            with lock:
                statuses[status] += 1
            if response.will_close:
                connection.close()
                connection = None
        if connection:
            connection.close()

    workers = [threading.Thread(target=guess, args=(n,)) for n in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()

    assert sum(statuses.values()) == threads * attempts and set(statuses) == {401, 429}
    assert len(checks.costs) == statuses[401] == basic_auth.CLIENT_BURST  # bcrypt ran for the first few only
    assert checks.most_at_once == basic_auth.BCRYPT_AT_ONCE
    # The scraper that logged in before keeps scraping from the same address, kept alive or not, without bcrypt.
    assert request(scraper, (USER, PASSWORD))[:2] == (200, BODY)
    assert get(s.url, auth=(USER, PASSWORD))[0] == 200
    status, headers, _ = get(s.url, auth=(USER, "one more guess"))
    assert status == 429 and int(headers["Retry-After"]) > 0
    assert len(checks.costs) == basic_auth.CLIENT_BURST
    scraper.close()


def connect(port: int, client: int) -> http.client.HTTPConnection:
    """A connection from 127.0.0.<client> (all loopback)."""
    return http.client.HTTPConnection("127.0.0.1", port, timeout=30, source_address=(f"127.0.0.{client}", 0))


def test_guesses_from_many_addresses_never_refuse_a_client_that_has_not_failed(
    server, tmp_path, count_checks, monkeypatch
):
    monkeypatch.setattr(basic_auth, "CLIENT_REFILL_SECONDS", 3600.0)
    monkeypatch.setattr(connections, "REFUSALS_BURST", 10**6)  # this test is about bcrypt; see test_web_limits.py
    scrapers = {f"scraper{n}": f"password{n}" for n in range(5)}
    s = server(web_config=web_config(tmp_path, users={USER: PASSWORD, **scrapers}))
    checks = count_checks()
    guessers, attempts = 12, basic_auth.CLIENT_BURST + 3
    statuses: collections.Counter[int] = collections.Counter()
    scraped: dict[str, int] = {}
    lock = threading.Lock()
    start = threading.Barrier(guessers + len(scrapers))

    def guess(client: int):
        start.wait()
        for attempt in range(attempts):
            connection = connect(s.port, client)
            status = request(connection, (USER, f"guess-{client}-{attempt}"))[0]
            connection.close()
            with lock:
                statuses[status] += 1

    def scrape(client: int, user: str):
        start.wait()
        connection = connect(s.port, client)
        scraped[user] = request(connection, (user, scrapers[user]))[0]
        connection.close()

    workers = [threading.Thread(target=guess, args=(2 + n,)) for n in range(guessers)]
    workers += [threading.Thread(target=scrape, args=(100 + n, user)) for n, user in enumerate(scrapers)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()

    # Each guessing address paid for its own failures; the scrapers, each logging in for the first time from an
    # address of its own while they guessed, were all let in.
    assert scraped == dict.fromkeys(scrapers, 200)
    assert statuses == {401: guessers * basic_auth.CLIENT_BURST, 429: guessers * 3}
    assert len(checks.costs) == guessers * basic_auth.CLIENT_BURST + len(scrapers)
    assert checks.most_at_once == basic_auth.BCRYPT_AT_ONCE
    # And after all of it, one more address that has never failed logs in.
    connection = connect(s.port, 200)
    assert request(connection, (USER, PASSWORD))[:2] == (200, BODY)
    connection.close()


def test_a_client_that_has_not_failed_goes_first_to_bcrypt():
    slots = basic_auth.BcryptSlots()
    assert slots.acquire(failed_before=False, timeout=60)
    order: list[str] = []

    def take(name: str, failed_before: bool):
        if slots.acquire(failed_before, timeout=60):
            order.append(name)
            slots.release()

    def until(condition):
        while not condition():
            threading.Event().wait(0.001)

    failed = threading.Thread(target=take, args=("failed", True))
    failed.start()
    until(lambda: len(slots._changed._waiters) == 1)  # waits first
    new = threading.Thread(target=take, args=("new", False))
    new.start()
    until(lambda: slots._first_waiting == 1)
    slots.release()
    failed.join()
    new.join()
    assert order == ["new", "failed"]


def test_a_logged_in_scraper_keeps_scraping_while_48_addresses_guess(server, tmp_path, count_checks):
    """Guesses at a bcrypt cost of 12 (a quarter of a second each), ten from each address, the next address as one
    is refused: none of it keeps a scraper that logged in before from its answer, kept alive or not."""
    s = server(web_config=web_config(tmp_path, cost=12))
    checks = count_checks()
    scraper = http.client.HTTPConnection("127.0.0.1", s.port, timeout=5, source_address=("127.0.0.2", 0))
    assert request(scraper, (USER, PASSWORD))[0] == 200  # logs in first
    addresses = itertools.count()
    stop = threading.Event()

    def guess():
        while not stop.is_set():
            n = next(addresses)
            address = f"127.1.{n >> 8 & 255}.{n & 255}"
            connection = http.client.HTTPConnection("127.0.0.1", s.port, timeout=60, source_address=(address, 0))
            try:
                for attempt in range(basic_auth.CLIENT_BURST):
                    if stop.is_set():
                        break
                    request(connection, (USER, f"guess-{n}-{attempt}"))
            except OSError:
                pass
            finally:
                connection.close()

    guessers = [threading.Thread(target=guess) for _ in range(48)]
    for guesser in guessers:
        guesser.start()
    try:
        wait_until(lambda: len(checks.costs) >= 4, what="bcrypt to check guesses")
        for _ in range(5):  # each within the connection's 5 s timeout
            assert request(scraper, (USER, PASSWORD))[:2] == (200, BODY)
            fresh = http.client.HTTPConnection("127.0.0.1", s.port, timeout=5, source_address=("127.0.0.2", 0))
            assert request(fresh, (USER, PASSWORD))[:2] == (200, BODY)
            fresh.close()
    finally:
        stop.set()
        for guesser in guessers:
            guesser.join()
        scraper.close()
    assert checks.most_at_once == basic_auth.BCRYPT_AT_ONCE


def test_a_login_that_cannot_have_bcrypt_in_time_is_a_429(server, tmp_path, monkeypatch):
    monkeypatch.setattr(basic_auth, "BCRYPT_WAIT_SECONDS", 0.2)
    s = server(web_config=web_config(tmp_path))
    slots = basic_auth._bcrypt_slots  # the process's: taken as by checks that run long
    for _ in range(basic_auth.BCRYPT_AT_ONCE):
        assert slots.acquire(failed_before=False, timeout=60)
    try:
        connection = http.client.HTTPConnection("127.0.0.1", s.port, timeout=10)
        status, body, response = request(connection, (USER, PASSWORD))
        connection.close()
    finally:
        for _ in range(basic_auth.BCRYPT_AT_ONCE):
            slots.release()
    assert (status, body) == (429, b"Too Many Requests: too many logins at once, retry later\n")
    assert response.getheader("Retry-After") == "1"
    assert get(s.url, auth=(USER, PASSWORD))[0] == 200  # once bcrypt is free, the same login succeeds


@pytest.mark.parametrize("cost", [4, 8, 12])
def test_an_unknown_user_costs_what_a_wrong_password_costs(server, tmp_path, count_checks, cost):
    s = server(web_config=web_config(tmp_path, cost))
    checks = count_checks()
    for auth in [(USER, "wrong"), ("nobody", PASSWORD), ("nobody", "wrong"), ("", "")]:
        checks.costs.clear()
        status, headers, _ = get(s.url, auth=auth)
        assert status == 401 and headers["WWW-Authenticate"].startswith("Basic ")
        assert checks.costs == [cost], auth  # one check, of a hash of the configured cost


def test_an_unknown_user_is_checked_at_the_highest_configured_cost(tmp_path):
    config = load_web_config(web_config(tmp_path, users={"a": "x"}))
    config.users["b"] = bcrypt.hashpw(b"y", bcrypt.gensalt(rounds=6))
    assert config.unknown_user_hash.startswith(b"$2b$06$")
    assert bcrypt.checkpw(b"x", config.unknown_user_hash) is False


def test_verified_credentials_are_checked_by_bcrypt_once(server, tmp_path, count_checks):
    s = server(web_config=web_config(tmp_path))
    checks = count_checks()
    for _ in range(3):
        assert get(s.url, auth=(USER, PASSWORD))[0] == 200
    assert get(s.url, auth=(USER, PASSWORD + "x"))[0] == 401
    assert len(checks.costs) == 2


def test_a_password_over_72_bytes_is_a_401(server, tmp_path, count_checks):
    long_password = "p" * 72
    s = server(web_config=web_config(tmp_path, users={USER: long_password}))
    checks = count_checks()
    for password in ("x" * 73, "é" * 37, long_password + "p"):  # bcrypt refuses them (ValueError)
        status, headers, _ = get(s.url, auth=(USER, password))
        assert status == 401 and "WWW-Authenticate" in headers
    assert checks.costs == []  # refused without bcrypt: none of them can match
    assert get(s.url, auth=(USER, "q" * 72))[0] == 401
    assert get(s.url, auth=(USER, long_password))[0] == 200
    assert len(checks.costs) == 2


@pytest.mark.parametrize(
    "header",
    [
        "Basic !!!",
        "Bearer abc",
        "Basic " + base64.b64encode(b"no-colon").decode(),
        "Basic " + base64.b64encode(b"\xff\xfe:x").decode(),
        "Basic é",
    ],
)
def test_a_malformed_authorization_is_a_401_without_bcrypt(server, tmp_path, count_checks, header):
    s = server(web_config=web_config(tmp_path))
    checks = count_checks()
    assert get(s.url, headers={"Authorization": header})[0] == 401
    assert checks.costs == []


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "OPTIONS", "PATCH", "BREW"])
def test_other_methods_are_401_without_credentials_and_405_with(server, tmp_path, method):
    s = server(web_config=web_config(tmp_path))
    connection = http.client.HTTPConnection("127.0.0.1", s.port, timeout=10)
    status, _, response = request(connection, None, method)
    assert status == 401 and response.getheader("WWW-Authenticate")
    status, _, response = request(connection, (USER, PASSWORD), method)
    assert status == 405 and response.getheader("Allow") == "GET, HEAD"
    connection.close()


def test_head_and_health_paths_are_behind_auth(server, tmp_path):
    s = server(web_config=web_config(tmp_path))
    connection = http.client.HTTPConnection("127.0.0.1", s.port, timeout=10)
    for path in ("/metrics", "/-/healthy", "/-/ready", "/"):
        status, body, _ = request(connection, None, "HEAD", path)
        assert (status, body) == (401, b""), path
        status, body, _ = request(connection, (USER, PASSWORD), "HEAD", path)
        assert (status, body) == (200, b""), path
        assert request(connection, None, "GET", path)[0] == 401
        assert request(connection, (USER, PASSWORD), "GET", path)[0] == 200
    connection.close()


def test_a_reload_keeps_the_logins_of_users_whose_hash_did_not_change(server, tmp_path, count_checks):
    path = web_config(tmp_path)
    s = server(web_config=path)
    checks = count_checks()
    assert get(s.url, auth=(USER, PASSWORD))[0] == 200
    other = bcrypt.hashpw(b"other", bcrypt.gensalt(rounds=4)).decode()
    path.write_text(path.read_text() + f"  grafana: {other}\n")  # a user added; the scraper's hash as it was
    wait_until(lambda: get(s.url, auth=("grafana", "other"))[0] == 200, timeout=30, what="the reload")
    before = len(checks.costs)
    assert get(s.url, auth=(USER, PASSWORD))[0] == 200
    assert len(checks.costs) == before  # still verified: no bcrypt, no place in the login queue
