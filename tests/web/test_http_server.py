"""The HTTP endpoint: /metrics and a landing page only, errors that do not kill it, TLS and basic auth."""

from __future__ import annotations

import gzip
import http.client
import os
import re
import socket
import subprocess
import urllib.error
import urllib.request

import pytest

from neuron_exporter import __version__
from neuron_exporter.config import ConfigError
from neuron_exporter.web.http_server import MetricsServer, metrics_server
from neuron_exporter.web.web_config import load_web_config
from tests.support.daemon import serve_command
from tests.support.http import BODY, client_context, get, raw_exchange
from tests.support.paths import ROOT
from tests.support.processes import wait_until

bcrypt = pytest.importorskip("bcrypt", reason="basic auth needs the 'auth' extra (bcrypt)")


def test_serves_the_exposition(server):
    s = server()
    assert re.fullmatch(rf"http://127\.0\.0\.1:{s.port}/metrics", s.url)
    status, headers, body = get(s.url)
    assert (status, body) == (200, BODY)
    assert headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert get(s.url + "?name[]=demo_total")[0] == 200


@pytest.mark.parametrize("fields", [1, 10, 11, 50, 500])
@pytest.mark.parametrize("path", ["/metrics", "/diagnosis"])
def test_unknown_or_many_query_fields_are_ignored(server, path, fields):
    s = metrics_server(lambda: BODY, dict, "127.0.0.1", 0, None).start()
    try:
        query = "&".join(f"x{i}={i}" for i in range(fields))
        plain = get(s.url.replace("/metrics", path))
        status, headers, body = get(s.url.replace("/metrics", path) + "?" + query)
        assert (status, headers["Content-Type"]) == (200, plain[1]["Content-Type"])
        if path == "/metrics":
            assert body == BODY
    finally:
        s.stop()


def test_gzip_when_asked(server):
    status, headers, body = get(server().url, headers={"Accept-Encoding": "gzip"})
    assert status == 200 and headers["Content-Encoding"] == "gzip"
    assert gzip.decompress(body) == BODY


def test_landing_page_links_metrics_and_shows_nothing_else(server, tmp_path, monkeypatch):
    monkeypatch.setenv("NEURON_EXPORTER_SPOOL_DIR", str(tmp_path))
    s = server()
    status, headers, body = get(s.url.replace("/metrics", "/"))
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    page = body.decode()
    assert 'href="/metrics"' in page and __version__ in page
    links = re.findall(r'href="([^"]*)"', page)
    assert links[0] == "/metrics" and all(link.startswith("/") and "//" not in link for link in links)
    for secret in (str(tmp_path), os.getcwd(), str(ROOT)):
        assert secret not in page


@pytest.mark.parametrize(
    "path", ["/etc/passwd", "/metrics/extra", "/../metrics", "/favicon.ico", "/debug/vars", "/metrics.txt"]
)
def test_any_other_path_is_404(server, path, tmp_path):
    s = server()
    status, _, body = get(f"http://127.0.0.1:{s.port}{path}")
    assert status == 404
    assert str(ROOT) not in body.decode()


def test_other_methods_are_405_with_allow(server):
    s = server()
    for method in ("POST", "PUT", "DELETE", "OPTIONS", "PATCH"):
        request = urllib.request.Request(s.url, data=b"x" if method != "OPTIONS" else None, method=method)
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(request, timeout=10)
        assert caught.value.code == 405, method
        assert caught.value.headers["Allow"] == "GET, HEAD"
    assert get(s.url)[0] == 200


def test_a_failing_render_is_a_500_and_the_server_survives(server):
    calls = []

    def render():
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("collector broke at /home/user/secret")
        return BODY

    s = server(render)
    status, _, body = get(s.url)
    assert status == 500
    assert body.count(b"\n") == 1 and b"secret" not in body
    status, _, body = get(s.url)
    assert (status, body) == (200, BODY)


def test_no_request_log_on_stderr(server, capfd):
    s = server()
    capfd.readouterr()
    for path in ("/metrics", "/", "/nope"):
        get(f"http://127.0.0.1:{s.port}{path}")
    assert capfd.readouterr().err == ""


def test_a_busy_port_raises_and_a_stopped_server_frees_its_port(server):
    s = server()
    with pytest.raises(OSError):
        MetricsServer(lambda: BODY, addr="127.0.0.1", port=s.port)
    port = s.port
    s.stop()
    again = MetricsServer(lambda: BODY, addr="127.0.0.1", port=port).start()
    try:
        assert get(again.url)[0] == 200
    finally:
        again.stop()


def test_stop_ends_kept_alive_connections(server):
    s = server()
    connection = http.client.HTTPConnection("127.0.0.1", s.port, timeout=10)
    connection.request("GET", "/metrics")
    assert connection.getresponse().read() == BODY  # the connection stays open (HTTP/1.1 keep-alive)
    s.stop()
    with pytest.raises((http.client.HTTPException, OSError)):
        connection.request("GET", "/metrics")
        connection.getresponse().read()
    connection.close()


def test_a_wildcard_address_gives_a_reachable_url():
    s = MetricsServer(lambda: BODY, addr="0.0.0.0", port=0).start()
    try:
        assert s.url == f"http://127.0.0.1:{s.port}/metrics"
        assert get(s.url)[0] == 200
    finally:
        s.stop()


# -- TLS and basic auth ------------------------------------------------------------------------------------


def test_https_with_basic_auth(server, tls_files):
    s = server(web_config=tls_files / "web.yml")
    assert s.url.startswith("https://127.0.0.1:")
    context = client_context(tls_files)
    status, _, body = get(s.url, context, auth=("prometheus", "s3cret"))
    assert (status, body) == (200, BODY)
    for auth in [("prometheus", "wrong"), ("someone", "s3cret"), None]:
        status, headers, _ = get(s.url, context, auth=auth)
        assert status == 401, auth
        assert headers["WWW-Authenticate"].startswith("Basic ")
    assert get(s.url.replace("/metrics", "/"), context)[0] == 401  # the landing page is protected too
    assert get(s.url, context, auth=("prometheus", "s3cret"))[0] == 200  # after failures, still serving


def test_plain_http_to_the_tls_port_gets_no_metrics(server, tls_files):
    s = server(web_config=load_web_config(tls_files / "web.yml"))
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        get(s.url.replace("https://", "http://"), auth=("prometheus", "s3cret"))
    assert get(s.url, client_context(tls_files), auth=("prometheus", "s3cret"))[0] == 200


def test_the_daemon_serves_https_with_basic_auth(tmp_path, tls_files):
    daemon = subprocess.Popen(
        serve_command(tmp_path / "spool", "--web.config.file", str(tls_files / "web.yml")),
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = daemon.stderr.readline()
        url = re.search(r"listening on (\S+)", line).group(1)
        assert url.startswith("https://")
        context = client_context(tls_files)
        status, _, body = get(url, context, auth=("prometheus", "s3cret"))
        assert status == 200 and b"neuron_exporter_ranks 0.0" in body
        assert get(url, context, auth=("prometheus", "nope"))[0] == 401
    finally:
        daemon.terminate()
        assert daemon.wait(timeout=30) == 0


@pytest.mark.parametrize(
    "text, expected",
    [
        ("tls_server_config:\n  cert_file: server.crt\n", "web.yml:1: tls_server_config.key_file is required"),
        (
            "tls_server_config:\n  cert_file: server.crt\n  key_file: server.crt\n",
            "web.yml:2: tls_server_config: cannot load the certificate and key",
        ),
        (
            "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  ciphers: x\n",
            'web.yml:4: unsupported key "ciphers" in tls_server_config',
        ),
        (
            "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  min_version: TLS99\n",
            'web.yml:4: tls_server_config.min_version: unknown version "TLS99"',
        ),
        ("basic_auth_users:\n  alice: plaintext\n", "web.yml:2: basic_auth_users.alice: expected a bcrypt hash"),
        (
            "basic_auth_users:\n  # a comment\n  alice: $2y$10$tooshort\n",
            "web.yml:3: basic_auth_users.alice: expected a bcrypt hash",
        ),
        ("basic_auth_users: [\n", "web.yml:2: invalid YAML"),
        ("- a\n", "web.yml:1: the web config must be a mapping"),
    ],
)
def test_web_config_errors_are_one_line(tls_files, tmp_path, text, expected):
    web = tls_files / "web.yml"
    bad = tls_files / f"bad-{abs(hash(text))}.yml"  # next to the certificate, so relative names resolve
    bad.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_web_config(bad)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(str(bad) + expected[len("web.yml") :]), message
    assert web.exists()


def test_a_port_in_use_is_waited_for_by_the_daemon(tmp_path):
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen()
    port = blocker.getsockname()[1]
    daemon = subprocess.Popen(
        serve_command(tmp_path, port=port),
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert "in use" in daemon.stderr.readline()
        assert daemon.poll() is None
        blocker.close()
        assert "listening on" in daemon.stderr.readline()
        wait_until(lambda: get(f"http://127.0.0.1:{port}/metrics")[0] == 200, what="the daemon on the freed port")
    finally:
        blocker.close()
        daemon.send_signal(2)  # SIGINT stops it as cleanly as SIGTERM
        assert daemon.wait(timeout=30) == 0


# -- HTTP dialect: HEAD, health paths, content negotiation, limits -------------------------------------------


def test_head_is_get_without_a_body(server):
    s = server()
    connection = http.client.HTTPConnection("127.0.0.1", s.port, timeout=10)
    for path in ("/metrics", "/", "/-/healthy", "/nope"):
        connection.request("GET", path)
        got = connection.getresponse()
        body = got.read()
        connection.request("HEAD", path)  # same kept-alive connection: a body sent after HEAD would corrupt it
        head = connection.getresponse()
        assert head.read() == b""
        assert head.status == got.status, path
        assert head.getheader("Content-Type") == got.getheader("Content-Type")
        assert int(head.getheader("Content-Length")) == len(body)
    connection.request("GET", "/metrics")
    assert connection.getresponse().read() == BODY
    connection.close()


@pytest.mark.parametrize("path, text", [("/-/healthy", b"Healthy"), ("/-/ready", b"Ready")])
def test_health_paths(server, path, text):
    status, headers, body = get(f"http://127.0.0.1:{server().port}{path}")
    assert status == 200 and text in body and body.count(b"\n") == 1
    assert headers["Content-Type"] == "text/plain; charset=utf-8"


PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0;q=0.5,application/openmetrics-text;version=0.0.1;"
    "q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2"
)  # what Prometheus 2.x sends


def demo_registry():
    from prometheus_client import CollectorRegistry, Counter, Histogram

    registry = CollectorRegistry()
    Counter("demo_steps", "Steps ended", ["rank"], registry=registry).labels("0").inc(3)
    Histogram("demo_step_seconds", "Step time", registry=registry).observe(0.2)
    return registry


@pytest.mark.parametrize("accept", ["application/openmetrics-text; version=1.0.0", PROMETHEUS_ACCEPT])
def test_openmetrics_when_asked(server, accept):
    s = server(demo_registry())
    status, headers, body = get(s.url, headers={"Accept": accept})
    assert status == 200 and headers["Content-Type"].startswith("application/openmetrics-text; version=1.0.0")
    assert body.endswith(b"# EOF\n") and b'demo_steps_total{rank="0"} 3.0' in body
    status, headers, gzipped = get(s.url, headers={"Accept": accept, "Accept-Encoding": "gzip"})
    assert headers["Content-Encoding"] == "gzip" and gzip.decompress(gzipped) == body


def test_text_format_otherwise_and_it_passes_promtool(server):
    s = server(demo_registry())
    status, headers, body = get(s.url)
    assert status == 200 and headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert b"# EOF" not in body and b'demo_steps_total{rank="0"} 3.0' in body
    check = subprocess.run(["promtool", "check", "metrics"], input=body, capture_output=True)
    assert check.returncode == 0, check.stdout + check.stderr


def test_a_text_only_source_answers_text_to_an_openmetrics_scraper(server):
    status, headers, body = get(server().url, headers={"Accept": PROMETHEUS_ACCEPT})
    assert (status, body) == (200, BODY)
    assert headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"


OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"
TEXT_0_0_4 = "text/plain; version=0.0.4; charset=utf-8"
PROMETHEUS_3_ACCEPT = (
    "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.5,application/openmetrics-text;"
    "version=0.0.1;q=0.4,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.3,text/plain;version=0.0.4;q=0.2,*/*;q=0.1"
)


@pytest.mark.parametrize(
    "accept, content_type",
    [
        ("application/openmetrics-text", OPENMETRICS),
        (PROMETHEUS_ACCEPT, OPENMETRICS + "; escaping=underscores"),
        (PROMETHEUS_3_ACCEPT, OPENMETRICS + "; escaping=allow-utf-8"),
        ("text/plain;version=1.0.0", "text/plain; version=1.0.0; charset=utf-8; escaping=underscores"),
        ("application/openmetrics-text;version=0.0.1", TEXT_0_0_4),  # too old for prometheus_client to write
        ("*/*", TEXT_0_0_4),
        ("", TEXT_0_0_4),
    ],
)
def test_a_registry_is_served_in_the_format_prometheus_client_chooses(server, accept, content_type):
    status, headers, body = get(server(demo_registry()).url, headers={"Accept": accept} if accept else {})
    assert status == 200 and headers["Content-Type"] == content_type
    assert body.endswith(b"# EOF\n") == content_type.startswith("application/openmetrics-text")


@pytest.mark.parametrize("accept", ["application/openmetrics-text", PROMETHEUS_3_ACCEPT, "text/plain;version=1.0.0"])
def test_a_text_only_source_is_text_0_0_4_whatever_is_asked(server, accept):
    status, headers, body = get(server().url, headers={"Accept": accept})
    assert (status, body, headers["Content-Type"]) == (200, BODY, TEXT_0_0_4)


def test_openmetrics_and_text_carry_the_same_samples(server):
    from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
    from prometheus_client.parser import text_string_to_metric_families as text_families

    def samples(families):
        return {(s.name, tuple(sorted(s.labels.items())), s.value) for family in families for s in family.samples}

    s = server(demo_registry())
    text = get(s.url)[2].decode()
    openmetrics = get(s.url, headers={"Accept": PROMETHEUS_ACCEPT})[2].decode()
    assert ("demo_steps_total", (("rank", "0"),), 3.0) in samples(text_families(text))
    assert samples(text_families(text)) == samples(openmetrics_families(openmetrics))  # a counter never jumps


NAME_SELECTIONS = [
    ["demo_steps_total"],
    ["demo_step_seconds_bucket", "demo_step_seconds_count"],
    ["demo_steps_total", "demo_step_seconds_sum", "no_such_name"],
    ["no_such_name"],
]


@pytest.mark.parametrize("names", NAME_SELECTIONS)
@pytest.mark.parametrize("accept", ["", PROMETHEUS_ACCEPT])
def test_name_selects_samples_as_prometheus_clients_own_endpoint_does(server, names, accept):
    from urllib.parse import urlencode

    from prometheus_client import make_wsgi_app

    registry = demo_registry()
    s = server(registry)
    query = "?" + urlencode([("name[]", name) for name in names])
    status, headers, body = get(s.url + query, headers={"Accept": accept} if accept else {})
    environ = {"QUERY_STRING": query[1:], "HTTP_ACCEPT": accept, "REQUEST_METHOD": "GET", "PATH_INFO": "/metrics"}
    theirs = b"".join(make_wsgi_app(registry)(environ, lambda *args: None))
    assert status == 200 and sorted(body.splitlines()) == sorted(theirs.splitlines())  # its families in any order
    full = get(s.url, headers={"Accept": accept} if accept else {})[2]
    assert body != full and (b"demo_steps_total" in body) == ("demo_steps_total" in names)


NODE_TEXT = (
    b"# HELP demo_total A demo\n# TYPE demo_total counter\n"
    b'demo_total{rank="0"} 1.0\ndemo_total{rank="1"} 2.0\n'
    b"# HELP demo_seconds Step time\n# TYPE demo_seconds histogram\n"
    b'demo_seconds_bucket{le="1.0"} 1.0\ndemo_seconds_bucket{le="+Inf"} 1.0\ndemo_seconds_count 1.0\n'
    b"demo_seconds_sum 0.5\n"
    b"# HELP other_info Info\n# TYPE other_info gauge\nother_info 1.0\n"
)


@pytest.mark.parametrize(
    "names, expected",
    [
        (["demo_total"], NODE_TEXT.split(b"# HELP demo_seconds")[0]),
        (
            ["demo_seconds_count", "other_info"],
            b"# HELP demo_seconds Step time\n# TYPE demo_seconds histogram\ndemo_seconds_count 1.0\n"
            b"# HELP other_info Info\n# TYPE other_info gauge\nother_info 1.0\n",
        ),
        (["no_such_name"], b""),
    ],
)
def test_name_selects_samples_of_a_text_source(server, names, expected):
    s = server(lambda: NODE_TEXT)
    query = "?" + "&".join(f"name[]={name}" for name in names)
    status, headers, body = get(s.url + query)
    assert (status, body, headers["Content-Type"]) == (200, expected, TEXT_0_0_4)
    status, headers, gzipped = get(s.url + query, headers={"Accept-Encoding": "gzip"})
    assert gzip.decompress(gzipped) == expected and get(s.url)[2] == NODE_TEXT


@pytest.mark.parametrize(
    "accept_encoding, gzipped",
    [
        ("gzip", True),
        ("GZIP", True),
        ("br, gzip;q=1.0", True),
        ("deflate,gzip", True),
        ("xgzip", False),
        ("gzip-x", False),
        ("identity", False),
        ("br, deflate", False),
        ("gzip;q=0", False),  # "not acceptable" (RFC 9110 12.4.2)
        ("gzip; q=0.000, identity", False),
        ("gzip;q=0.001", True),
        ("GZIP;Q=1", True),
        ("gzip;q=junk", False),
        ("br;q=0, gzip;q=0.5", True),
    ],
)
@pytest.mark.parametrize("registry", [False, True], ids=["text", "registry"])
def test_gzip_only_when_accept_encoding_names_it(server, accept_encoding, gzipped, registry):
    s = server(demo_registry()) if registry else server()
    plain = get(s.url)[2]
    status, headers, body = get(s.url, headers={"Accept-Encoding": accept_encoding})
    assert status == 200 and headers.get("Content-Encoding") == ("gzip" if gzipped else None)
    assert (gzip.decompress(body) if gzipped else body) == plain


@pytest.mark.parametrize(
    "request_head, status",
    [
        (b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n", b"431"),
        (b"GET /metrics HTTP/1.1\r\n" + b"X-Many: 1\r\n" * 101 + b"\r\n", b"431"),
        (b"GET /metrics\r\n\r\n", b"400"),
        (b"GET /metrics HTTP/1.1\r\n bad header\r\n\r\n", b"400"),
        (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n", b"400"),  # binary junk
    ],
)
def test_malformed_or_oversized_request_heads(server, request_head, status):
    s = server()
    reply = raw_exchange(s.port, request_head)
    assert reply.startswith(b"HTTP/1.1 " + status), reply[:80]
    assert b"Connection: close" in reply
    assert get(s.url)[0] == 200


def test_pipelined_requests_are_answered_in_order(server):
    s = server()
    reply = raw_exchange(
        s.port,
        b"GET /-/healthy HTTP/1.1\r\nHost: x\r\n\r\nHEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
        b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    assert reply.count(b"HTTP/1.1 200 OK") == 3
    assert reply.index(b"Healthy") < reply.index(b"demo_total") and reply.endswith(BODY)
