"""Every option of ``attach()`` and of the node daemon, with its default, and how they are resolved.

Precedence, lowest first: the YAML config file, ``NEURON_EXPORTER_<KEY>`` environment variables, then
explicit overrides (command-line flags or ``attach()`` keyword arguments). ``NEURON_EXPORTER_CONFIG``
names the config file when none is given explicitly. Every mistake raises ``ConfigError`` with a one-line
message naming the option and where it came from (file and line, variable, or flag).
"""

from __future__ import annotations

import math
import os
import tempfile
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path

import yaml

ENV_PREFIX = "NEURON_EXPORTER_"
CONFIG_FILE_ENV = ENV_PREFIX + "CONFIG"
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


class ConfigError(ValueError):
    """A configuration mistake; ``str()`` is one line saying what is wrong and where."""


def default_spool_dir() -> str:
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK | os.X_OK):
        return str(shm / "neuron-exporter")
    return str(Path(tempfile.gettempdir()) / "neuron-exporter")


def _option(default=None, doc: str = "", *, factory=None, shown: str | None = None):
    metadata = {"doc": doc, "shown": shown}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass
class Options:
    addr: str = _option("0.0.0.0", "Address the HTTP endpoint binds to (`127.0.0.1` for local only, `::` for IPv6).")
    port: int = _option(9478, "Port of the HTTP endpoint; 0 picks a free one.")
    spool_dir: str = _option(
        doc="Directory where every rank writes its metrics for the node endpoint (use a tmpfs).",
        factory=default_spool_dir,
        shown="`/dev/shm/neuron-exporter` if /dev/shm is writable, else `$TMPDIR/neuron-exporter`")
    spool_interval_seconds: float = _option(2.0, "How often a rank rewrites its spool file.")
    hung_after_seconds: float = _option(
        60.0, "A live rank that has ended no step for this long (before its first step: sent no report) is hung.")
    expire_after_seconds: float = _option(
        3600.0, "A rank that stopped reporting (hung, dead or finished) is served with its last values until its "
                "last report is this old; then a dead rank's files are deleted.")
    warmup_steps: int = _option(2, "Steps whose compilations are not counted as recompilations.")
    max_op_series: int = _option(
        100, "At most this many `op` label values per operator family; the rest are counted as `op=\"other\"`.")
    web_config_file: str | None = _option(
        None, "Web config file for TLS and basic auth (format of Prometheus exporters' `--web.config.file`).")
    node_view: bool = _option(
        True, "The training rank that holds the port also serves the other ranks of the machine (from the spool).")
    log_level: str = _option("warning", "Log level: " + ", ".join(LOG_LEVELS) + ".")


OPTION_NAMES = tuple(f.name for f in fields(Options))
_TYPES = typing.get_type_hints(Options)


def _check_port(value):
    if not 0 <= value <= 65535:
        return f"{value} is not a valid port (0-65535)"


def _check_positive(value):
    if not value > 0:
        return f"{value:g} must be greater than 0"


def _check_not_negative(value):
    if value < 0:
        return f"{value:g} must be 0 or more"


def _check_non_empty(value):
    if not value:
        return "must not be empty"


def _check_log_level(value):
    if value not in LOG_LEVELS:
        return f'"{value}" is not a log level ({", ".join(LOG_LEVELS)})'


_CHECKS: dict[str, Callable] = {
    "addr": _check_non_empty,
    "port": _check_port,
    "spool_dir": _check_non_empty,
    "spool_interval_seconds": _check_positive,
    "hung_after_seconds": _check_positive,
    "expire_after_seconds": _check_positive,
    "warmup_steps": _check_not_negative,
    "max_op_series": _check_positive,
    "log_level": _check_log_level,
}

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _convert(key: str, value, from_text: bool):
    """``value`` as the option's type, or raise ValueError with the reason (without the option's name)."""
    kind = _TYPES[key]
    shown = f'"{value}"' if isinstance(value, str) else ("null" if value is None else str(value))
    if from_text and isinstance(value, str):
        text = value.strip()
        if kind is int:
            try:
                value = int(text)
            except ValueError:
                raise ValueError(f"expected an integer, got {shown}") from None
        elif kind is float:
            try:
                value = float(text)
            except ValueError:
                raise ValueError(f"expected a number, got {shown}") from None
        elif kind is bool:
            if text.lower() not in _TRUE + _FALSE:
                raise ValueError(f"expected true or false, got {shown}")
            value = text.lower() in _TRUE
        elif kind == (str | None) and text == "":
            value = None
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"expected an integer, got {shown}")
    elif kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"expected a number, got {shown}")
        value = float(value)
        if not math.isfinite(value):
            raise ValueError(f"expected a finite number, got {shown}")
    elif kind is bool:
        if not isinstance(value, bool):
            raise ValueError(f"expected true or false, got {shown}")
    elif kind is str:
        if not isinstance(value, str):
            raise ValueError(f"expected a string, got {shown}")
    elif kind == (str | None):
        if value is not None and not isinstance(value, (str, os.PathLike)):
            raise ValueError(f"expected a string, got {shown}")
        value = None if value is None else os.fspath(value)
    if key == "log_level":
        value = value.lower()
    problem = _CHECKS.get(key, lambda v: None)(value)
    if problem:
        raise ValueError(problem)
    return value


def _known() -> str:
    return ", ".join(OPTION_NAMES)


def _from_file(path) -> dict:
    path_text = os.fspath(path)
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"{path_text}: cannot read config file: {exc.strerror or exc}") from None
    loader = yaml.SafeLoader(text)
    try:
        root = loader.get_single_node()
        if root is None:
            return {}
        if not isinstance(root, yaml.MappingNode):
            raise ConfigError(f"{path_text}:{root.start_mark.line + 1}: the config file must be a mapping "
                              f"of option names to values (known: {_known()})")
        values, seen = {}, {}
        for key_node, value_node in root.value:
            line = key_node.start_mark.line + 1
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
            if key not in OPTION_NAMES:
                raise ConfigError(f'{path_text}:{line}: unknown key "{key}" (known: {_known()})')
            if key in seen:
                raise ConfigError(f'{path_text}:{line}: duplicate key "{key}" (first on line {seen[key]})')
            seen[key] = line
            if not isinstance(value_node, yaml.ScalarNode):
                raise ConfigError(f"{path_text}:{value_node.start_mark.line + 1}: {key}: expected a single value")
            raw = loader.construct_object(value_node, deep=True)
            try:
                values[key] = _convert(key, raw, from_text=False)
            except ValueError as exc:
                raise ConfigError(f"{path_text}:{value_node.start_mark.line + 1}: {key}: {exc}") from None
        return values
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path_text}:{mark.line + 1}" if mark else path_text
        raise ConfigError(f"{where}: invalid YAML: {getattr(exc, 'problem', None) or exc}") from None
    finally:
        loader.dispose()


def _from_env(env: Mapping[str, str]) -> dict:
    values = {}
    for name, text in env.items():
        if not name.startswith(ENV_PREFIX) or name == CONFIG_FILE_ENV:
            continue
        key = name[len(ENV_PREFIX):].lower()
        values[key] = _checked(key, text, name)
    return values


def _checked(key: str, value, name: str):
    """``value`` converted for option ``key``; errors name the option as the user gave it (``name``)."""
    if key not in OPTION_NAMES:
        raise ConfigError(f"{name}: unknown option (known: {_known()})")
    try:
        return _convert(key, value, from_text=True)
    except ValueError as exc:
        raise ConfigError(f"{name}: {exc}") from None


def resolve_options(config_file=None, env: Mapping[str, str] = os.environ, overrides: Mapping | None = None,
                    *, override_name: Callable[[str], str] | None = None) -> Options:
    """Options from ``config_file`` < ``env`` < ``overrides``; overrides whose value is None are not given.

    ``override_name(key)`` says how an override is named in errors (default ``option <key>``; the CLI
    passes one that gives the flag). String overrides of other types are parsed like environment values.
    """
    name_of = override_name or (lambda key: f"option {key}")
    if config_file is None:
        config_file = env.get(CONFIG_FILE_ENV) or None
    values = _from_file(config_file) if config_file is not None else {}
    values.update(_from_env(env))
    for key, value in (overrides or {}).items():
        if value is not None:
            values[key] = _checked(key, value, name_of(key))
    return Options(**values)


def options_table() -> str:
    """The Markdown table of options, defaults and environment variables shown in the docs."""
    rows = ["| option | default | environment variable | meaning |", "| --- | --- | --- | --- |"]
    for f in fields(Options):
        shown = f.metadata["shown"]
        if shown is None:
            default = f.default
            shown = "none" if default is None else (str(default).lower() if isinstance(default, bool)
                                                     else f"`{default}`")
        rows.append(f"| `{f.name}` | {shown} | `{ENV_PREFIX}{f.name.upper()}` | {f.metadata['doc']} |")
    return "\n".join(rows) + "\n"
