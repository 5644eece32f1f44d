"""The web config file: anything wrong with it is one line naming the file, the line and the problem, never a
traceback; a running server re-reads it and its certificate when they change, and keeps the old ones if the new
ones are bad."""

from __future__ import annotations

import logging
import os
import shutil
import socket
import ssl
import subprocess
import threading
import urllib.request
from pathlib import Path

import pytest

from neuron_exporter.web import web_config
from neuron_exporter.web.http_server import MetricsServer
from neuron_exporter.web.web_config import WebConfigError, load_web_config
from tests.support.daemon import serve_command
from tests.support.fuzz import cases
from tests.support.http import get, make_certificate
from tests.support.paths import ROOT
from tests.support.processes import wait_until

bcrypt = pytest.importorskip("bcrypt", reason="basic auth needs the 'auth' extra (bcrypt)")


def hashed(password: str, cost: int = 4) -> str:
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=cost)).decode().replace("$2b$", "$2y$")


@pytest.fixture(scope="module")
def certificate(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("certificate")
    make_certificate(directory)
    return directory


# -- one line for every bad file -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data, expected",
    [
        ("basic_auth_users: {}\n".encode("utf-16"), ":1: not UTF-8 text (byte 0); a web config is UTF-8"),
        ("basic_auth_users: {}\n".encode("utf-16-le"), ':1: invalid YAML: the character "\\x00" is not allowed'),
        (b"basic_auth_users:\n  jos\xe9: x\n", ":2: not UTF-8 text (byte 23); a web config is UTF-8"),
        (b"tls_server_config:\n  cert_file: a\x00b\n", ':2: invalid YAML: the character "\\x00" is not allowed'),
        (b"basic_auth_users: " + b"[" * 5000 + b"]" * 5000 + b"\n", ":1: nested deeper than 50 levels"),
        (b"a:\n" + b"".join(b" " * n + b"b:\n" for n in range(1, 200)), ":51: nested deeper than 50 levels"),
        (b"# " + b"x" * (2 << 20) + b"\n", ": larger than 1 MiB, too large for a web config"),
        (b"basic_auth_users:\n  alice: \x07\n", ':2: invalid YAML: the character "\\x07" is not allowed'),
        (b'"cipher\\nsuites": x\n', ':1: unsupported key "cipher\\nsuites"'),
        (b"basic_auth_users:\n  alice: a\n  alice: b\n", ':3: duplicate key "alice" (first on line 2)'),
        (
            b"basic_auth_users:\n  alice: $2y$99$" + b"a" * 53 + b"\n",
            ":2: basic_auth_users.alice: bcrypt cost 99 is out",
        ),
        (b"basic_auth_users:\n  alice: $2y$10$" + b"z" * 53 + b"\n", ":2: basic_auth_users.alice: not a valid bcrypt"),
        (
            b"tls_server_config:\n  cert_file: server.crt\n  key_file: .\n",
            ':3: tls_server_config.key_file: cannot read ".": not a regular file',
        ),
        (b"basic_auth_users: *nothing\n", ":1: invalid YAML: found undefined alias 'nothing'"),
        (  # below the default minimum: every handshake would fail
            b"tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  max_version: TLS11\n",
            ':4: tls_server_config.max_version: "TLS11" is below the minimum version (TLS12, the default)',
        ),
        (
            b"tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  min_version: TLS13\n"
            b"  max_version: TLS12\n",
            ':5: tls_server_config.max_version: "TLS12" is below the minimum version (TLS13)',
        ),
    ],
)
def test_a_bad_file_is_one_line(certificate, data, expected):
    path = certificate / "bad.yml"
    path.write_bytes(data)
    with pytest.raises(WebConfigError) as caught:
        load_web_config(path)
    message = str(caught.value)
    assert message.isprintable() and message.startswith(f"{path}{expected}"), message


def test_a_fifo_is_refused_without_blocking(tmp_path):
    os.mkfifo(tmp_path / "web.yml")
    with pytest.raises(
        WebConfigError, match=r"web\.yml: cannot read web config: not a regular file \(a FIFO, device or socket\)$"
    ):
        load_web_config(tmp_path / "web.yml")


@pytest.mark.parametrize("data", ["basic_auth_users: {}\n".encode("utf-16"), b"x: \xff\n", b"a: " + b"[" * 3000])
def test_the_daemon_prints_one_line_for_a_bad_web_config(tmp_path, data):
    (tmp_path / "web.yml").write_bytes(data)
    result = subprocess.run(
        serve_command(tmp_path / "spool", "--web.config.file", str(tmp_path / "web.yml")),
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
    assert f"{tmp_path / 'web.yml'}:1: " in result.stderr


def test_fuzz_load_web_config(certificate):
    user_a, user_b = hashed("a"), hashed("b", cost=5).replace("$2y$", "$2b$")
    seeds = [
        f"tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
        f"basic_auth_users:\n  alice: {user_a}\n  bob: '{user_b}'\n",
        "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  client_ca_file: server.crt\n"
        "  client_auth_type: RequireAndVerifyClientCert\n  min_version: TLS12\n  max_version: TLS13\n",
        f'# users only\nbasic_auth_users: {{alice: "{user_a}", bob: {user_b}}}\n',
        "tls_server_config: {cert_file: server.crt, key_file: server.key, client_auth_type: NoClientCert}\n",
    ]
    path = certificate / "fuzz.yml"
    for seed in seeds:
        path.write_text(seed)
        load_web_config(path)  # the seeds are valid
    loaded = 0
    for case, data in cases([seed.encode() for seed in seeds], "web_config"):
        path.write_bytes(data)
        try:
            load_web_config(path)
            loaded += 1
        except WebConfigError as error:
            assert str(error).isprintable() and str(error).startswith(str(path)), f"{case}: {error}"
        except BaseException as error:  # noqa: BLE001 - anything else is the bug this test looks for
            pytest.fail(f"case {case}: {type(error).__name__}: {error}")
    assert loaded > 0  # some mutations stay valid: the seeds were not all broken the same way


# -- re-read while serving ------------------------------------------------------------------------------------------


def served_certificate(port: int) -> bytes:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, context.wrap_socket(raw) as tls:
        return tls.getpeercert(binary_form=True)


def test_a_replaced_certificate_is_served_on_a_new_connection_without_a_restart(tmp_path):
    first = make_certificate(tmp_path)
    (tmp_path / "web.yml").write_text("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n")
    with MetricsServer(lambda: b"", "127.0.0.1", 0, tmp_path / "web.yml") as s:
        assert served_certificate(s.port) == first
        second = make_certificate(tmp_path, "new")
        os.replace(tmp_path / "new.key", tmp_path / "server.key")  # as cert-manager or certbot renew one
        os.replace(tmp_path / "new.crt", tmp_path / "server.crt")
        wait_until(lambda: served_certificate(s.port) == second, timeout=30, what="the new certificate")
        context = ssl.create_default_context(cafile=str(tmp_path / "server.crt"))
        with urllib.request.urlopen(s.url, timeout=10, context=context) as response:
            assert response.status == 200


def test_a_bad_new_web_config_keeps_the_old_one_and_logs_one_line(tmp_path, caplog):
    config = tmp_path / "web.yml"
    config.write_text(f"basic_auth_users:\n  prometheus: {hashed('old')}\n")
    caplog.set_level(logging.INFO, logger="neuron_exporter.web")
    with MetricsServer(lambda: b"ok\n", "127.0.0.1", 0, config) as s:
        assert get(s.url, auth=("prometheus", "old"))[0] == 200
        config.write_bytes(b"basic_auth_users: [\n")

        def warned():
            assert get(s.url, auth=("prometheus", "old"))[0] == 200  # every new connection: the old config
            return [r for r in caplog.records if r.levelno == logging.WARNING]

        (warning,) = wait_until(warned, timeout=30, what="the bad config to be noticed")
        assert warning.getMessage().count("\n") == 0 and f"{config}:2: invalid YAML" in warning.getMessage()
        for _ in range(5):
            assert get(s.url, auth=("prometheus", "old"))[0] == 200
        assert len(warned()) == 1

        config.write_text(f"basic_auth_users:\n  prometheus: {hashed('new')}\n")
        # Polled with the old password, verified before and so accepted without a check until the reload: polling
        # with the new one would fail until then, and enough failures get an address rate limited.
        wait_until(lambda: get(s.url, auth=("prometheus", "old"))[0] == 401, timeout=30, what="the new config")
        assert get(s.url, auth=("prometheus", "new"))[0] == 200
        assert any("reloaded" in r.getMessage() for r in caplog.records)


def test_tls_cannot_be_turned_off_by_a_reload(certificate, tmp_path, caplog):
    for name in ("server.crt", "server.key"):
        shutil.copy(certificate / name, tmp_path / name)
    config = tmp_path / "web.yml"
    config.write_text("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n")
    with MetricsServer(lambda: b"ok\n", "127.0.0.1", 0, config) as s:
        config.write_text("basic_auth_users: {}\n")
        wait_until(
            lambda: (
                served_certificate(s.port) and any("TLS cannot be turned off" in r.getMessage() for r in caplog.records)
            ),
            timeout=30,
            what="the refused reload",
        )
        assert served_certificate(s.port) == ssl.PEM_cert_to_DER_cert((tmp_path / "server.crt").read_text())


def test_a_slow_reload_never_stalls_accepts_and_the_old_config_serves_meanwhile(tmp_path, monkeypatch):
    """Reading a web config of thousands of bcrypt users takes seconds: it happens beside the server, never in the
    thread that accepts connections, and the new config replaces the old one only once read whole."""
    config = tmp_path / "web.yml"
    config.write_text(f"basic_auth_users:\n  prometheus: {hashed('old')}\n")
    reading, release = threading.Event(), threading.Event()
    real = web_config.load_web_config

    def slow(path):  # a reload that takes as long as the test says
        reading.set()
        assert release.wait(60)
        return real(path)

    with MetricsServer(lambda: b"ok\n", "127.0.0.1", 0, config) as s:
        monkeypatch.setattr(web_config, "load_web_config", slow)
        config.write_text(f"basic_auth_users:\n  prometheus: {hashed('new')}\n")
        # Each get() is a new connection: accepted and answered, with the old config, while the reload waits.
        wait_until(lambda: get(s.url, auth=("prometheus", "old"))[0] == 200 and reading.is_set(), what="a reload")
        for _ in range(5):
            assert get(s.url, auth=("prometheus", "old"))[0] == 200
        assert not release.is_set()
        release.set()
        wait_until(lambda: get(s.url, auth=("prometheus", "old"))[0] == 401, timeout=30, what="the new config")
        assert get(s.url, auth=("prometheus", "new"))[0] == 200
