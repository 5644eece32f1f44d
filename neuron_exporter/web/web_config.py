"""TLS and basic auth from a web config file, in the format of Prometheus exporters' ``--web.config.file``.

    tls_server_config:
      cert_file: server.crt          # relative paths are relative to this file
      key_file: server.key
      client_ca_file: ca.crt         # optional, with client_auth_type
      client_auth_type: RequireAndVerifyClientCert
      min_version: TLS12
    basic_auth_users:
      prometheus: $2y$10$...         # bcrypt hash (htpasswd -nBC 10 "" | tr -d ':')

Every error is one line naming the file, the line and the key.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import ssl
import threading
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ..config import ConfigError

TLS_KEYS = ("cert_file", "key_file", "client_ca_file", "client_auth_type", "min_version", "max_version")
TOP_KEYS = ("tls_server_config", "basic_auth_users")
CLIENT_AUTH_TYPES = {
    "NoClientCert": ssl.CERT_NONE,
    "RequestClientCert": ssl.CERT_OPTIONAL,
    "RequireAnyClientCert": ssl.CERT_REQUIRED,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
TLS_VERSIONS = {"TLS10": ssl.TLSVersion.TLSv1, "TLS11": ssl.TLSVersion.TLSv1_1,
                "TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
BCRYPT_HASH = re.compile(r"\$2[aby]\$\d\d\$[./A-Za-z0-9]{53}")
# Checked against a username that does not exist, so a wrong user costs as much time as a wrong password.
_DUMMY_HASH = b"$2b$10$16QYdcPcUMFPPHwyP9P9Puf.7eFoirYwXqZXCO189zYWOde0ido.K"


class WebConfigError(ConfigError):
    pass


@dataclass
class WebConfig:
    ssl_context: ssl.SSLContext | None = None
    users: dict[str, bytes] = field(default_factory=dict)  # username -> bcrypt hash
    _verified: set[bytes] = field(default_factory=set, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def tls(self) -> bool:
        return self.ssl_context is not None

    def check_authorization(self, header: str | None) -> bool:
        """True if ``header`` (an HTTP Authorization value) names a user and the right password."""
        if not header or not header.startswith("Basic "):
            return False
        try:
            user, _, password = base64.b64decode(header[6:], validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return False
        # bcrypt is slow on purpose; remember credentials already verified (as a digest, never in clear).
        digest = hashlib.sha256(f"{user}\0{password}".encode()).digest()
        with self._lock:
            if digest in self._verified:
                return True
        import bcrypt
        hashed = self.users.get(user)
        ok = bcrypt.checkpw(password.encode(), hashed or _DUMMY_HASH) and hashed is not None
        if ok:
            with self._lock:
                if len(self._verified) < 1024:
                    self._verified.add(digest)
        return ok


def load_web_config(path) -> WebConfig:
    """Read and check a web config file; build the TLS context now so a bad certificate fails at start-up."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise WebConfigError(f"{path}: cannot read web config: {exc.strerror or exc}") from None
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise WebConfigError(f"{where}: invalid YAML: {getattr(exc, 'problem', None) or exc}") from None
    config = WebConfig()
    if root is None:
        return config
    top = _mapping(path, root, "web config")
    for key, (key_node, value_node) in top.items():
        if key not in TOP_KEYS:
            raise WebConfigError(f"{path}:{_line(key_node)}: unsupported key \"{key}\" "
                                 f"(supported: {', '.join(TOP_KEYS)})")
    if "tls_server_config" in top:
        config.ssl_context = _tls_context(path, *top["tls_server_config"])
    if "basic_auth_users" in top:
        config.users = _users(path, top["basic_auth_users"][1])
    return config


def _line(node) -> int:
    return node.start_mark.line + 1


def _mapping(path: Path, node, what: str) -> dict[str, tuple]:
    if isinstance(node, yaml.ScalarNode) and node.tag.endswith(":null"):
        return {}
    if not isinstance(node, yaml.MappingNode):
        raise WebConfigError(f"{path}:{_line(node)}: {what} must be a mapping of keys to values")
    result = {}
    for key_node, value_node in node.value:
        if not isinstance(key_node, yaml.ScalarNode):
            raise WebConfigError(f"{path}:{_line(key_node)}: keys of {what} must be plain strings")
        result[str(key_node.value)] = (key_node, value_node)
    return result


def _string(path: Path, section: str, key: str, node) -> str:
    if not isinstance(node, yaml.ScalarNode) or node.tag.endswith(":null") or node.value == "":
        raise WebConfigError(f"{path}:{_line(node)}: {section}.{key}: expected a string")
    return str(node.value)


def _tls_context(path: Path, section_node, node) -> ssl.SSLContext:
    section = "tls_server_config"
    items = _mapping(path, node, section)
    values = {}
    for key, (key_node, value_node) in items.items():
        if key not in TLS_KEYS:
            raise WebConfigError(f"{path}:{_line(key_node)}: unsupported key \"{key}\" in {section} "
                                 f"(supported: {', '.join(TLS_KEYS)})")
        values[key] = (value_node, _string(path, section, key, value_node))
    for required in ("cert_file", "key_file"):
        if required not in values:
            raise WebConfigError(f"{path}:{_line(section_node)}: {section}.{required} is required")

    def file(key: str) -> str:
        value_node, name = values[key]
        resolved = path.parent / name
        try:
            with open(resolved, "rb"):
                pass
        except OSError as exc:
            raise WebConfigError(f"{path}:{_line(value_node)}: {section}.{key}: cannot read {name}: "
                                 f"{exc.strerror or exc}") from None
        return str(resolved)

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    cert, key = file("cert_file"), file("key_file")
    try:
        context.load_cert_chain(cert, key)
    except (ssl.SSLError, OSError) as exc:
        raise WebConfigError(f"{path}:{_line(values['cert_file'][0])}: {section}: cannot load the certificate "
                             f"and key: {getattr(exc, 'reason', None) or exc}") from None
    for bound in ("min_version", "max_version"):
        if bound in values:
            value_node, name = values[bound]
            if name not in TLS_VERSIONS:
                raise WebConfigError(f"{path}:{_line(value_node)}: {section}.{bound}: unknown version \"{name}\" "
                                     f"(known: {', '.join(TLS_VERSIONS)})")
            setattr(context, "minimum_version" if bound == "min_version" else "maximum_version",
                    TLS_VERSIONS[name])
    auth_type = values.get("client_auth_type", (None, "NoClientCert"))
    if auth_type[1] not in CLIENT_AUTH_TYPES:
        raise WebConfigError(f"{path}:{_line(auth_type[0])}: {section}.client_auth_type: unknown value "
                             f"\"{auth_type[1]}\" (known: {', '.join(CLIENT_AUTH_TYPES)})")
    context.verify_mode = CLIENT_AUTH_TYPES[auth_type[1]]
    if "client_ca_file" in values:
        try:
            context.load_verify_locations(cafile=file("client_ca_file"))
        except ssl.SSLError as exc:
            raise WebConfigError(f"{path}:{_line(values['client_ca_file'][0])}: {section}.client_ca_file: "
                                 f"not a CA certificate: {exc.reason or exc}") from None
    elif context.verify_mode != ssl.CERT_NONE:
        raise WebConfigError(f"{path}:{_line(auth_type[0])}: {section}.client_auth_type {auth_type[1]} "
                             "needs client_ca_file")
    return context


def _users(path: Path, node) -> dict[str, bytes]:
    users = {}
    for user, (key_node, value_node) in _mapping(path, node, "basic_auth_users").items():
        hashed = _string(path, "basic_auth_users", user, value_node)
        if not BCRYPT_HASH.fullmatch(hashed):
            raise WebConfigError(f"{path}:{_line(value_node)}: basic_auth_users.{user}: expected a bcrypt hash "
                                 "($2y$10$ and 53 more characters, e.g. from htpasswd -nBC 10)")
        users[user] = hashed.encode()
    if users:
        try:
            import bcrypt  # noqa: F401
        except ImportError:
            raise WebConfigError(f"{path}:{_line(node)}: basic_auth_users needs the bcrypt package: "
                                 "pip install 'neuron-exporter[auth]'") from None
    return users
