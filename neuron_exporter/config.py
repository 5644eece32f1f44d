"""Every option of ``attach()`` and of the node daemon, with its default, and how they are resolved.

Precedence, lowest first: the YAML config file, ``NEURON_EXPORTER_<KEY>`` environment variables, then
explicit overrides (command-line flags or ``attach()`` keyword arguments). ``NEURON_EXPORTER_CONFIG``
names the config file when none is given explicitly. Every mistake raises ``ConfigError`` with a one-line
message naming the option and where it came from (file and line, variable, or flag).
"""

from __future__ import annotations

import math
import os
import pwd
import tempfile
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path

import yaml

from . import AUTO_ENV, FALSE, TRUE
from . import auto_enabled as auto_enabled  # read where config is too heavy to import, see __init__
from .config_file import ConfigError, YamlFile
from .untrusted import SHOWN_CHARACTERS, printable, quoted

ENV_PREFIX = "NEURON_EXPORTER_"
CONFIG_FILE_ENV = ENV_PREFIX + "CONFIG"
PASSWORD_ENV = ENV_PREFIX + "PASSWORD"  # the basic-auth password of `neuron-exporter diagnose --user`
# Variables of the prefix that are not options: the options reader leaves them alone.
NOT_OPTIONS = (CONFIG_FILE_ENV, AUTO_ENV, PASSWORD_ENV)
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
# spool_mode -> (the directory's mode, its files' mode): files are never writable by anyone but their writer.
SPOOL_MODES = {
    "private": (0o700, 0o600),  # only this user (and root) reads: the default
    "group": (0o750, 0o640),  # a daemon in the directory's group reads
    "readable": (0o755, 0o644),  # every local user reads (a daemon running as another user), only this user writes
    "group-shared": (0o1770, 0o640),  # the jobs of several users of one group write, like /tmp for a group
    "shared": (0o1777, 0o644),  # every local user writes, like /tmp: trusts every local user
}


def _shown(value) -> str:
    """A value as an error shows it: strings quoted, everything escaped and cut short."""
    if value is None:
        return "null"
    if isinstance(value, str):
        return quoted(value)
    if isinstance(value, int) and abs(value) >= 10**SHOWN_CHARACTERS:  # str() refuses more than 4300 digits
        return f"an integer of more than {SHOWN_CHARACTERS} digits"
    return printable(str(value), SHOWN_CHARACTERS)


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
    port: int = _option(19478, "Port of the HTTP endpoint; 0 picks a free one.")
    spool_dir: str = _option(
        doc="Directory where every rank writes its metrics for the node endpoint (use a tmpfs).",
        factory=default_spool_dir,
        shown="`/dev/shm/neuron-exporter` if /dev/shm is writable, else `$TMPDIR/neuron-exporter`",
    )
    spool_mode: str = _option(
        "private",
        "Who may read and write the spool directory: `private` (mode 0700), `group` (0750), `readable` "
        "(0755), `group-shared` (1770), `shared` (1777). A rank refuses a directory more open than this, "
        "or another user's; see deploy/PROTOCOL.md.",
    )
    spool_trusted_users: str | None = _option(
        None,
        "Users (names or uids, comma-separated) the node endpoint trusts to own the spool directory and its "
        "files, beyond root and its own user; in the `group-shared` and `shared` modes, files of any user are "
        "served (the directory still must be a trusted user's).",
    )
    spool_max_file_bytes: int = _option(
        4 * 1024 * 1024, "The node endpoint ignores a rank file larger than this (and counts it)."
    )
    spool_max_total_bytes: int = _option(
        12 * 1024 * 1024,
        "The node endpoint reads at most this much of the spool directory in all (rank files, then their "
        "diagnoses): trusted users' files first, then other users' live ranks, live runs first, then by run and "
        "rank; the rest is not served (and counted). 12 MiB: 128 ranks of 96 KiB, and what Prometheus ingests in "
        "a scrape of a few seconds.",
    )
    spool_max_files: int = _option(
        1024,
        "The node endpoint serves at most this many rank files (trusted users' first, live runs first, then by "
        "run and rank) and looks at no more than four times as many; the rest are not served (and counted). "
        "Files refused unread (another user's, a bad header) do not count.",
    )
    spool_interval_seconds: float = _option(2.0, "How often a rank rewrites its spool file.")
    hung_after_seconds: float = _option(
        60.0,
        "A live rank that has ended no step for this long is hung; before its first step (a rank claimed by a "
        "compilation), counted from when the node endpoint first saw it, or from its last report if older.",
    )
    expire_after_seconds: float = _option(
        3600.0,
        "A rank that stopped reporting (hung, dead or finished) is served with its last values until its "
        "last report is this old; then a dead rank's files are deleted.",
    )
    warmup_steps: int = _option(
        2,
        "Steps after which recompilations alert (`XlaRecompilationStorm` counts a rank "
        "once it had made this many steps at the first sample of its 5-minute window); it "
        "changes no count.",
    )
    max_op_series: int = _option(
        100, 'At most this many `op` label values per operator family; the rest are counted as `op="other"`.'
    )
    max_site_series: int = _option(
        50, 'At most this many `location` label values per family; the rest are counted as `location="other"`.'
    )
    fallback_sites: bool = _option(
        False,
        "Name the source line of each CPU-fallback operator: the step after one first falls back runs under a "
        "dispatch mode that sees every operator call. Costs microseconds per operator for that one step, and "
        "may compile it once more (not counted as a recompilation).",
    )
    peak_flops: float = _option(
        0.0,
        "The peak FLOP/s of a rank's devices for the data type it trains in, served as `training_peak_flops` (the "
        "denominator of MFU); 0: the Trainium generation's, from the Neuron documentation's figures, absent where "
        "unknown (the CPU, a GPU).",
    )
    run_id: str | None = _option(
        None,
        "The run's identity, the `run_id` label of every series (default: torchrun's or Slurm's job id, else "
        "the launching process); every process of a run must have the same.",
    )
    instance_id: str | None = _option(
        None,
        "The EC2 instance id of the `instance_id` label that joins a rank to neuron-monitor's series (default: the "
        "instance's own, from its DMI board asset tag or the metadata service, looked up beside the training; "
        "absent elsewhere).",
    )
    process_tag: bool = _option(
        False,
        "Set `NEURON_PROCESS_TAG` to `<run_id>.rank<rank>` at `attach()`, so that neuron-monitor's series name the "
        "rank (`runtime_tag`); only before the Neuron runtime starts, and never over a tag of your own.",
    )
    web_config_file: str | None = _option(
        None, "Web config file for TLS and basic auth (format of Prometheus exporters' `--web.config.file`)."
    )
    node_view: bool = _option(
        True,
        "The training job serves every rank of the machine on its port, from a process of its own that reads the "
        "spool (no rank merges files on its training thread); false: a rank serves only its own metrics.",
    )
    log_level: str = _option("warning", "Log level: " + ", ".join(LOG_LEVELS) + ".")


OPTION_NAMES = tuple(f.name for f in fields(Options))
OPTION_TYPES = typing.get_type_hints(Options)
# The options the node endpoint reads, which `neuron-exporter serve` takes as flags; `run`, which passes the options
# on to the ranks it starts, takes every option.
NODE_OPTIONS = (
    "addr",
    "port",
    "spool_dir",
    "spool_mode",
    "spool_trusted_users",
    "spool_max_file_bytes",
    "spool_max_total_bytes",
    "spool_max_files",
    "hung_after_seconds",
    "expire_after_seconds",
    "web_config_file",
    "log_level",
)


def flag(key: str) -> str:
    """The command-line flag of option ``key``: ``--spool-dir``; the web config's is the one Prometheus exporters
    have, ``--web.config.file``."""
    return "--web.config.file" if key == "web_config_file" else "--" + key.replace("_", "-")


def option_help(key: str) -> str:
    """The option's description up to its first full stop or semicolon, as a flag's help."""
    doc = next(f.metadata["doc"] for f in fields(Options) if f.name == key)
    return doc.split(". ")[0].split("; ")[0].rstrip(".").replace("`", "")


def _check_port(value):
    if not 0 <= value <= 65535:
        return f"{value} is not a valid port (0-65535)"


def _check_positive(value):
    if not value > 0:
        return f"{value:g} must be greater than 0"


def _check_not_negative(value):
    if value < 0:
        return f"{value:g} must be 0 or more"


def _check_no_nul(value):
    if value is not None and "\0" in value:
        return f"{_shown(value)} has a NUL character"


def _check_non_empty(value):
    if not value:
        return "must not be empty"
    return _check_no_nul(value)


def _check_instance_id(value):
    if value is not None and not (value.isprintable() and 0 < len(value) <= 64 and " " not in value):
        return f"{_shown(value)} is not an instance id (at most 64 printable characters, no spaces)"


def _check_spool_mode(value):
    if value not in SPOOL_MODES:
        return f"{_shown(value)} is not a spool mode ({', '.join(SPOOL_MODES)})"


def user_ids(users: str | None) -> set[int]:
    """The uids of ``users``: names or uids, separated by commas. ``ValueError`` names an unknown user."""
    uids = set()
    for name in (users or "").split(","):
        name = name.strip()
        if name.isdigit():
            uids.add(int(name))
        elif name:
            try:
                uids.add(pwd.getpwnam(name).pw_uid)
            except KeyError:
                raise ValueError(f"no user called {_shown(name)} on this machine") from None
    return uids


def _check_users(value):
    if value is not None and "\0" not in value:
        try:
            user_ids(value)
        except ValueError as error:
            return str(error)
    return _check_no_nul(value)


def _check_log_level(value):
    if value not in LOG_LEVELS:
        return f"{_shown(value)} is not a log level ({', '.join(LOG_LEVELS)})"


_CHECKS: dict[str, Callable] = {
    "addr": _check_non_empty,
    "port": _check_port,
    "spool_dir": _check_non_empty,
    "spool_mode": _check_spool_mode,
    "spool_trusted_users": _check_users,
    "spool_max_file_bytes": _check_positive,
    "spool_max_total_bytes": _check_positive,
    "spool_max_files": _check_positive,
    "spool_interval_seconds": _check_positive,
    "hung_after_seconds": _check_positive,
    "expire_after_seconds": _check_positive,
    "warmup_steps": _check_not_negative,
    "max_op_series": _check_positive,
    "max_site_series": _check_positive,
    "peak_flops": _check_not_negative,
    "run_id": _check_no_nul,
    "instance_id": _check_instance_id,
    "web_config_file": _check_no_nul,
    "log_level": _check_log_level,
}


def child_environment(
    values: Mapping, run_id: str, autostart_dir: str, environ: Mapping[str, str] = os.environ
) -> dict[str, str]:
    """``environ`` for child processes that attach themselves when they import torch, with the options ``values``
    (those that are None are not given), ``NEURON_EXPORTER_AUTO``, the run they are of, and ``autostart_dir``
    (``neuron_exporter.training.AUTOSTART_DIR``) first on ``PYTHONPATH`` (once)."""
    env = dict(environ)
    for key, value in values.items():
        if value is not None:
            env[ENV_PREFIX + key.upper()] = str(value).lower() if isinstance(value, bool) else str(value)
    env[AUTO_ENV] = "1"
    env[ENV_PREFIX + "RUN_ID"] = run_id
    path = env.get("PYTHONPATH", "")
    if autostart_dir not in path.split(os.pathsep):
        env["PYTHONPATH"] = autostart_dir + (os.pathsep + path if path else "")
    return env


def _convert(key: str, value, from_text: bool):
    """``value`` as the option's type, or raise ValueError with the reason (without the option's name)."""
    kind = OPTION_TYPES[key]
    shown = _shown(value)
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
            if text.lower() not in TRUE + FALSE:
                raise ValueError(f"expected true or false, got {shown}")
            value = text.lower() in TRUE
        elif kind == (str | None) and text == "":
            value = None
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"expected an integer, got {shown}")
        if value.bit_length() > 63:
            raise ValueError(f"{shown} is too large (a 64-bit integer is expected)")
    elif kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"expected a number, got {shown}")
        try:
            value = float(value)
        except OverflowError:  # an integer of more than 1024 bits
            value = math.inf
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
    """The options of a config file, converted and checked."""
    document = YamlFile(path, "config file")
    expected = f"the config file must be a mapping of option names to values (known: {_known()})"
    values = {}
    for key, (key_node, value_node) in document.mapping(document.root, expected).items():
        if key not in OPTION_NAMES:
            raise document.error(f"unknown key {_shown(key)} (known: {_known()})", key_node)
        if not isinstance(value_node, yaml.ScalarNode):
            raise document.error("expected a single value", value_node, key)
        raw = document.value(value_node, key)
        try:
            values[key] = _convert(key, raw, from_text=False)
        except ValueError as exc:
            raise document.error(str(exc), value_node, key) from None
    return values


def _from_env(env: Mapping[str, str]) -> dict:
    values = {}
    for name, text in env.items():
        if not name.startswith(ENV_PREFIX) or name in NOT_OPTIONS:
            continue
        key = name[len(ENV_PREFIX) :].lower()
        values[key] = _checked(key, text, name)
    return values


def _checked(key: str, value, name: str):
    """``value`` converted for option ``key``; errors name the option as the user gave it (``name``)."""
    if key not in OPTION_NAMES:
        raise ConfigError(f"unknown option (known: {_known()})", option=name)
    try:
        return _convert(key, value, from_text=True)
    except ValueError as exc:
        raise ConfigError(str(exc), option=name) from None


def resolve_options(
    config_file=None,
    env: Mapping[str, str] = os.environ,
    overrides: Mapping | None = None,
    *,
    override_name: Callable[[str], str] | None = None,
) -> Options:
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
    rows = ["| option | default | environment variable | flag | meaning |", "| --- | --- | --- | --- | --- |"]
    for f in fields(Options):
        shown = f.metadata["shown"]
        if shown is None:
            default = f.default
            shown = (
                "none" if default is None else (str(default).lower() if isinstance(default, bool) else f"`{default}`")
            )
        flags = f"`{flag(f.name)}` ({'`serve`, `run`' if f.name in NODE_OPTIONS else '`run`'})"
        rows.append(f"| `{f.name}` | {shown} | `{ENV_PREFIX}{f.name.upper()}` | {flags} | {f.metadata['doc']} |")
    return "\n".join(rows) + "\n"
