"""Fixtures of the web room: a metrics server, TLS files."""

import pytest

from neuron_exporter.web.http_server import MetricsServer
from tests.support.http import BODY, make_certificate

bcrypt = pytest.importorskip("bcrypt", reason="basic auth needs the 'auth' extra (bcrypt)")


@pytest.fixture
def server():
    started = []

    def start(render=lambda: BODY, **kwargs):
        s = MetricsServer(render, addr="127.0.0.1", port=0, **kwargs).start()
        started.append(s)
        return s

    yield start
    for s in started:
        s.stop()


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory):
    """A self-signed certificate for 127.0.0.1 and a web config using it with one bcrypt user."""
    directory = tmp_path_factory.mktemp("tls")
    make_certificate(directory)
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode().replace("$2b$", "$2y$")  # htpasswd's form
    (directory / "web.yml").write_text(
        "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
        f"basic_auth_users:\n  prometheus: {hashed}\n"
    )
    return directory
