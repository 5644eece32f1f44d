"""Config files that are not YAML text, or whose values no option can hold: one line naming the file (and line and
key where known), escaped and short; for ``serve``, that line and exit code 2 (systemd then stops restarting)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from neuron_exporter.config import ConfigError, resolve_options
from neuron_exporter.config_file import MAX_BYTES
from tests.support.config_errors import serve

LONGEST_ERROR = 550  # characters: the list of known options is the longest part


def error_of(path: Path) -> str:
    with pytest.raises(ConfigError) as caught:
        resolve_options(path, env={})
    message = str(caught.value)
    assert message.isprintable() and len(message) <= LONGEST_ERROR, message
    return message


def config(tmp_path: Path, data: bytes | str) -> Path:
    path = tmp_path / "exporter.yaml"
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return path


@pytest.mark.parametrize(
    "data, expected",
    [
        (b"port: 9478\naddr: \xff\n", ":2: not UTF-8 text (byte 17); a config file is UTF-8"),
        ("port: 9478\n".encode("utf-16"), ":1: not UTF-8 text (byte 0); a config file is UTF-8"),
        ("port: 9478\n".encode("utf-16-be"), ':1: invalid YAML: the character "\\x00" is not allowed'),
        (b"port: 9478\n\0\n", ':2: invalid YAML: the character "\\x00" is not allowed'),
        (b"addr: \x1b[31m\n", ':1: invalid YAML: the character "\\x1b" is not allowed'),
        (b"port: " + b"[" * 5000, ":1: nested deeper than 50 levels"),
        (b"port:\n" + b"- " * 5000 + b"1\n", ":2: nested deeper than 50 levels"),
        (b"# " + b"x" * MAX_BYTES + b"\n", ": larger than 1 MiB, too large for a config file"),
    ],
)
def test_files_that_are_not_yaml_text(tmp_path, data, expected):
    path = config(tmp_path, data)
    assert error_of(path) == f"{path}{expected}"


def test_a_utf8_bom_is_read(tmp_path):
    assert resolve_options(config(tmp_path, "\ufeffport: 9000\n"), env={}).port == 9000


def test_a_file_of_1_mib_is_read(tmp_path):
    text = "port: 9000\n# "
    path = config(tmp_path, text + "x" * (MAX_BYTES - len(text) - 1) + "\n")
    assert resolve_options(path, env={}).port == 9000


def test_a_directory(tmp_path):
    assert error_of(tmp_path) == f"{tmp_path}: cannot read config file: it is a directory"


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/null"])
def test_a_device(device):
    assert error_of(Path(device)) == f"{device}: cannot read config file: not a regular file (a FIFO, device or socket)"


def test_a_fifo_is_not_waited_on(tmp_path):
    fifo = tmp_path / "exporter.yaml"
    os.mkfifo(fifo)
    assert error_of(fifo) == f"{fifo}: cannot read config file: not a regular file (a FIFO, device or socket)"


def test_a_file_name_with_control_characters(tmp_path):
    assert error_of(tmp_path / "a\x1b[2J\n.yaml").startswith(f"{tmp_path}/a\\x1b[2J\\n.yaml: cannot read config file")


@pytest.mark.parametrize(
    "text, expected",
    [
        ("port: !!int 12x\n", ":1: port: cannot read the value: invalid literal for int() with base 10: '12x'"),
        ("port: !!timestamp 2020-13-45\n", ":1: port: cannot read the value: month must be in 1..12"),
        ("port: " + "9" * 5000 + "\n", ":1: port: cannot read the value: Exceeds the limit (4300"),  # 3.10: no "digits"
        (
            "port: 0x" + "f" * 5000 + "\n",
            ":1: port: an integer of more than 80 digits is too large (a 64-bit integer is expected)",
        ),
        ("warmup_steps: " + "9" * 20 + "\n", ":1: warmup_steps: 99999999999999999999 is too large"),
        (
            "hung_after_seconds: 0x" + "f" * 400 + "\n",
            ":1: hung_after_seconds: expected a finite number, got an integer",
        ),
        ("port: !!python/object:os.system x\n", ":1: invalid YAML: could not determine a constructor"),
        ('addr: "a\\0b"\n', ':1: addr: "a\\x00b" has a NUL character'),
        ('web_config_file: "web\\0.yml"\n', ':1: web_config_file: "web\\x00.yml" has a NUL character'),
        ('log_level: "\\e[31m' + "x" * 1000 + '"\n', f':1: log_level: "\\x1b[31m{"x" * 72}..." is not a log level'),
        ("? " + "k" * 5000 + "\n: 1\n", f':1: unknown key "{"k" * 80}..." (known: addr, port, '),
        ("*" + "a" * 5000 + "\n", ":1: invalid YAML: found undefined alias 'aaa"),
    ],
)
def test_values_no_option_can_hold(tmp_path, text, expected):
    path = config(tmp_path, text)
    assert error_of(path).startswith(f"{path}{expected}")


# -- the daemon: one line, exit code 2, before anything starts


@pytest.mark.parametrize("case", ["not UTF-8", "UTF-16", "NUL", "deeply nested", "huge", "directory", "FIFO"])
def test_serve_with_a_config_that_is_not_yaml_text(tmp_path, case):
    path = tmp_path / "exporter.yaml"
    if case == "directory":
        path.mkdir()
    elif case == "FIFO":
        os.mkfifo(path)
    else:
        path.write_bytes(
            {
                "not UTF-8": b"port: \xff\n",
                "UTF-16": "port: 1\n".encode("utf-16"),
                "NUL": b"port: 1\n\0",
                "deeply nested": b"port: " + b"[" * 100_000,
                "huge": b"#" * (MAX_BYTES + 1),
            }[case]
        )
    result = serve(tmp_path, "--config", str(path))
    assert (result.returncode, result.stdout) == (2, ""), result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert result.stderr.startswith(f"neuron-exporter serve: {path}")
