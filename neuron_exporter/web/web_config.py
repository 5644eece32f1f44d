"""TLS and basic auth from a web config file, in the format of Prometheus exporters' ``--web.config.file``.

    tls_server_config:
      cert_file: server.crt          # relative paths are relative to this file
      key_file: server.key
      client_ca_file: ca.crt         # optional, with client_auth_type
      client_auth_type: RequireAndVerifyClientCert
      min_version: TLS12
    basic_auth_users:
      prometheus: $2y$10$...         # bcrypt hash (htpasswd -nBC 10 "" | tr -d ':')

Every error is one line naming the file, the line and what is wrong. A running server re-reads the file, the
certificate and the key when one of them changes (``WebConfigReloader``), as Prometheus exporters do.
"""

from __future__ import annotations

import logging
import os
import re
import ssl
import stat
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ..config_file import ConfigError, YamlFile
from ..config_file import line_of as _line
from ..untrusted import quoted as _quote

log = logging.getLogger(__name__)

TLS_KEYS = ("cert_file", "key_file", "client_ca_file", "client_auth_type", "min_version", "max_version")
TOP_KEYS = ("tls_server_config", "basic_auth_users")
CLIENT_AUTH_TYPES = {
    "NoClientCert": ssl.CERT_NONE,
    "RequestClientCert": ssl.CERT_OPTIONAL,
    "RequireAnyClientCert": ssl.CERT_REQUIRED,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
BCRYPT_HASH = re.compile(r"\$2[aby]\$(\d\d)\$[./A-Za-z0-9]{53}")
BCRYPT_COSTS = range(4, 32)
# Salt and digest of a bcrypt hash of nothing anyone knows. With the configured users' cost in front it is the hash
# checked for a user that does not exist, so a wrong user costs exactly what a wrong password costs.
_UNKNOWN_USER_HASH_TAIL = "16QYdcPcUMFPPHwyP9P9Puf.7eFoirYwXqZXCO189zYWOde0ido.K"
RELOAD_CHECK_SECONDS = 1.0


WebConfigError = ConfigError


@dataclass
class WebConfig:
    ssl_context: ssl.SSLContext | None = None
    users: dict[str, bytes] = field(default_factory=dict)  # username -> bcrypt hash
    path: Path | None = None  # the file it was read from, None if built in code (then never re-read)
    file_stamps: dict[str, tuple | None] = field(default_factory=dict, repr=False)  # every file read, as read
    # username -> keyed digest of the password bcrypt last accepted for it (see basic_auth.py)
    verified: dict[str, bytes] = field(default_factory=dict, repr=False)

    @property
    def tls(self) -> bool:
        return self.ssl_context is not None

    @property
    def unknown_user_hash(self) -> bytes:
        cost = max((int(hashed[4:6]) for hashed in self.users.values()), default=10)
        return f"$2b${cost:02d}${_UNKNOWN_USER_HASH_TAIL}".encode()


def load_web_config(path) -> WebConfig:
    """Read and check a web config file; build the TLS context now so a bad certificate fails at start-up.
    Raises ``WebConfigError`` (one line) and nothing else for anything wrong with the file or the files it names."""
    path = Path(path)
    config = WebConfig(path=path)
    config.file_stamps[str(path)] = _stamp(path)  # before reading: a change after it is noticed
    document = YamlFile(path, "web config")
    top = document.mapping(document.root, "the web config must be a mapping of keys to values")
    for key, (key_node, _value_node) in top.items():
        if key not in TOP_KEYS:
            raise WebConfigError(
                f"{path}:{_line(key_node)}: unsupported key {_quote(key)} (supported: {', '.join(TOP_KEYS)})"
            )
    if "tls_server_config" in top:
        config.ssl_context = _tls_context(document, config, *top["tls_server_config"])
    if "basic_auth_users" in top:
        config.users = _users(document, top["basic_auth_users"][1])
    return config


def _regular_file_stamp(path) -> tuple:
    """The file's stamp (see ``_stamp``); ``OSError`` for anything but a regular file, which could block a read."""
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise OSError("not a regular file")
    return st.st_ino, st.st_mtime_ns, st.st_size


def _stamp(path) -> tuple | None:
    """What changes when a file is written or replaced; None if it cannot be read."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


def _string(path: Path, section: str, key: str, node) -> str:
    if not isinstance(node, yaml.ScalarNode) or node.tag.endswith(":null") or node.value == "":
        raise WebConfigError(f"{path}:{_line(node)}: {section}.{key}: expected a string")
    return str(node.value)


def _tls_context(document: YamlFile, config: WebConfig, section_node, node) -> ssl.SSLContext:
    path, section = document.path, "tls_server_config"
    items = document.mapping(node, f"{section} must be a mapping of keys to values")
    values = {}
    for key, (key_node, value_node) in items.items():
        if key not in TLS_KEYS:
            raise WebConfigError(
                f"{path}:{_line(key_node)}: unsupported key {_quote(key)} in {section} "
                f"(supported: {', '.join(TLS_KEYS)})"
            )
        values[key] = (value_node, _string(path, section, key, value_node))
    for required in ("cert_file", "key_file"):
        if required not in values:
            raise WebConfigError(f"{path}:{_line(section_node)}: {section}.{required} is required")

    def file(key: str) -> str:
        value_node, name = values[key]
        resolved = path.parent / name
        try:
            config.file_stamps[str(resolved)] = _regular_file_stamp(resolved)
            with open(resolved, "rb"):
                pass
        except (OSError, ValueError) as exc:  # ValueError: a NUL in the name
            raise WebConfigError(
                f"{path}:{_line(value_node)}: {section}.{key}: cannot read {_quote(name)}: "
                f"{getattr(exc, 'strerror', None) or exc}"
            ) from None
        return str(resolved)

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    cert, key = file("cert_file"), file("key_file")
    try:
        context.load_cert_chain(cert, key)
    except (ssl.SSLError, OSError, ValueError) as exc:
        raise WebConfigError(
            f"{path}:{_line(values['cert_file'][0])}: {section}: cannot load the certificate "
            f"and key: {getattr(exc, 'reason', None) or exc}"
        ) from None
    versions: dict[str, ssl.TLSVersion] = {}
    for bound in ("min_version", "max_version"):
        if bound in values:
            value_node, name = values[bound]
            if name not in TLS_VERSIONS:
                raise WebConfigError(
                    f"{path}:{_line(value_node)}: {section}.{bound}: unknown version {_quote(name)} "
                    f"(known: {', '.join(TLS_VERSIONS)})"
                )
            versions[bound] = TLS_VERSIONS[name]
    if "max_version" in versions and versions["max_version"] < versions.get("min_version", context.minimum_version):
        value_node, name = values["max_version"]
        raise WebConfigError(
            f"{path}:{_line(value_node)}: {section}.max_version: {_quote(name)} is below the minimum version "
            f"({values['min_version'][1] if 'min_version' in values else 'TLS12, the default'}): no client could "
            "connect"
        )
    for bound, version in versions.items():
        try:
            setattr(context, "minimum_version" if bound == "min_version" else "maximum_version", version)
        except (ValueError, ssl.SSLError) as exc:
            raise WebConfigError(f"{path}:{_line(values[bound][0])}: {section}.{bound}: {exc}") from None
    auth_type = values.get("client_auth_type", (None, "NoClientCert"))
    if auth_type[1] not in CLIENT_AUTH_TYPES:
        raise WebConfigError(
            f"{path}:{_line(auth_type[0])}: {section}.client_auth_type: unknown value "
            f"{_quote(auth_type[1])} (known: {', '.join(CLIENT_AUTH_TYPES)})"
        )
    context.verify_mode = CLIENT_AUTH_TYPES[auth_type[1]]
    if "client_ca_file" in values:
        try:
            context.load_verify_locations(cafile=file("client_ca_file"))
        except (ssl.SSLError, OSError, ValueError) as exc:
            raise WebConfigError(
                f"{path}:{_line(values['client_ca_file'][0])}: {section}.client_ca_file: "
                f"not a CA certificate: {getattr(exc, 'reason', None) or exc}"
            ) from None
    elif context.verify_mode != ssl.CERT_NONE:
        raise WebConfigError(
            f"{path}:{_line(auth_type[0])}: {section}.client_auth_type {auth_type[1]} needs client_ca_file"
        )
    return context


def _users(document: YamlFile, node) -> dict[str, bytes]:
    path, users, lines = document.path, {}, {}
    expected = "basic_auth_users must be a mapping of keys to values"
    for user, (_key_node, value_node) in document.mapping(node, expected).items():
        hashed = _string(path, "basic_auth_users", user, value_node)
        where = f"{path}:{_line(value_node)}: basic_auth_users.{user}"
        match = BCRYPT_HASH.fullmatch(hashed)
        if not match:
            raise WebConfigError(
                f"{where}: expected a bcrypt hash ($2y$10$ and 53 more characters, e.g. from htpasswd -nBC 10)"
            )
        if int(match.group(1)) not in BCRYPT_COSTS:
            raise WebConfigError(f"{where}: bcrypt cost {match.group(1)} is out of range (4 to 31)")
        users[user] = hashed.encode()
        lines[user] = _line(value_node)
    if users:
        try:
            import bcrypt
        except ImportError:
            raise WebConfigError(
                f"{path}:{_line(node)}: basic_auth_users needs the bcrypt package: pip install 'neuron-exporter[auth]'"
            ) from None
        for user, encoded in users.items():
            try:  # the same hash at the lowest cost: bcrypt reads the salt as it would at a login, in 1 ms
                bcrypt.checkpw(b"", encoded[:4] + b"04" + encoded[6:])
            except ValueError:
                raise WebConfigError(
                    f"{path}:{lines[user]}: basic_auth_users.{user}: not a valid bcrypt hash (its salt does not decode)"
                ) from None
    return users


class WebConfigReloader:
    """The web config of a running server, re-read when one of its files changes (checked at most once a second).

    The file is read in a thread of its own (checking thousands of bcrypt hashes takes seconds), never by the
    caller: the previous config serves until the new one is read whole, then the new one replaces it at once. A new
    file that fails to load keeps the previous config, with one log line per distinct error. A change that would
    turn TLS on or off is refused too: the scheme of the endpoint's URL cannot change under its scrapers.
    """

    def __init__(self, config: WebConfig | None):
        self.config = config
        self._checked = time.monotonic()
        self._stamps = dict(config.file_stamps) if config is not None else {}
        self._last_error: str | None = None
        self._reloading: threading.Thread | None = None

    def current(self) -> WebConfig | None:
        """The config in use; starts a reload if a file changed. Never waits for one."""
        config = self.config
        now = time.monotonic()
        if config is None or config.path is None or now - self._checked < RELOAD_CHECK_SECONDS:
            return config
        if self._reloading is not None and self._reloading.is_alive():
            return config
        self._checked = now
        stamps = {name: _stamp(name) for name in self._stamps}
        if stamps == self._stamps:
            return config
        self._stamps = stamps  # retried only after the next change
        self._reloading = threading.Thread(
            target=self._reload, args=(config,), name="neuron-exporter-web-config", daemon=True
        )
        self._reloading.start()
        return config

    def _reload(self, config: WebConfig) -> None:
        assert config.path is not None
        try:
            new = load_web_config(config.path)
            if new.tls != config.tls:
                raise WebConfigError(
                    f"{config.path}: TLS cannot be turned {'on' if new.tls else 'off'} without a restart"
                )
        except WebConfigError as error:
            if str(error) != self._last_error:
                self._last_error = str(error)
                log.warning("web config not reloaded, the previous one stays in use: %s", error)
            return
        except Exception as error:  # noqa: BLE001 - the server keeps its config whatever goes wrong here
            log.warning("web config not reloaded, the previous one stays in use: %s: %s", type(error).__name__, error)
            return
        self._last_error = None
        self._stamps = dict(new.file_stamps)
        # Logins verified before stay verified for users whose hash is the same: a reload during a flood of guesses
        # would otherwise send every scraper back to the bcrypt queue.
        unchanged = {user for user, hashed in new.users.items() if config.users.get(user) == hashed}
        new.verified.update((user, digest) for user, digest in config.verified.copy().items() if user in unchanged)
        self.config = new
        log.info("web config reloaded from %s", config.path)
