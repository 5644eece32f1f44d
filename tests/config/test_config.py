"""Options: defaults, file < environment < flags, and one-line errors naming the key and where it came from."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from neuron_exporter.config import ConfigError, Options, child_environment, default_spool_dir, resolve_options
from neuron_exporter.training import AUTOSTART_DIR
from tests.support.config_errors import serve
from tests.support.paths import ROOT

CLI = [sys.executable, "-m", "neuron_exporter"]


def write(tmp_path: Path, text: str, name: str = "exporter.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def error_of(**kwargs) -> str:
    with pytest.raises(ConfigError) as caught:
        resolve_options(**kwargs)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_defaults():
    options = resolve_options(env={})
    assert options == Options()
    assert (
        options.addr,
        options.port,
        options.spool_interval_seconds,
        options.hung_after_seconds,
        options.expire_after_seconds,
        options.warmup_steps,
        options.max_op_series,
        options.web_config_file,
        options.node_view,
        options.log_level,
    ) == ("0.0.0.0", 19478, 2.0, 60.0, 3600.0, 2, 100, None, True, "warning")
    assert options.spool_dir == default_spool_dir()
    assert options.spool_dir.endswith("/neuron-exporter")


def test_file_then_environment_then_overrides(tmp_path):
    config = write(tmp_path, "port: 9000\naddr: 127.0.0.1\nhung_after_seconds: 30\nnode_view: false\n")
    env = {"NEURON_EXPORTER_PORT": "9100", "NEURON_EXPORTER_WARMUP_STEPS": "5", "UNRELATED": "x"}
    options = resolve_options(config, env=env, overrides={"port": 9200, "addr": None})
    assert (options.port, options.addr, options.hung_after_seconds, options.node_view, options.warmup_steps) == (
        9200,
        "127.0.0.1",
        30.0,
        False,
        5,
    )


def test_config_file_named_by_the_environment(tmp_path):
    config = write(tmp_path, "max_op_series: 7\n")
    assert resolve_options(env={"NEURON_EXPORTER_CONFIG": str(config)}).max_op_series == 7


def test_text_values_are_parsed_like_the_environment():
    env = {
        "NEURON_EXPORTER_NODE_VIEW": "off",
        "NEURON_EXPORTER_SPOOL_INTERVAL_SECONDS": "0.5",
        "NEURON_EXPORTER_WEB_CONFIG_FILE": "",
        "NEURON_EXPORTER_LOG_LEVEL": "DEBUG",
    }
    options = resolve_options(env=env, overrides={"port": "0"})
    assert (
        options.node_view,
        options.spool_interval_seconds,
        options.web_config_file,
        options.log_level,
        options.port,
    ) == (False, 0.5, None, "debug", 0)


def test_an_empty_file_means_defaults(tmp_path):
    assert resolve_options(write(tmp_path, "# nothing set\n"), env={}) == Options()


@pytest.mark.parametrize(
    "text, expected",
    [
        ("addr: 0.0.0.0\nport: 19478\n\nprot: 1\n", 'exporter.yaml:4: unknown key "prot" (known: addr, port, '),
        ("port: x\n", 'exporter.yaml:1: port: expected an integer, got "x"'),
        ("port: 1.5\n", "exporter.yaml:1: port: expected an integer, got 1.5"),
        ("port: 70000\n", "exporter.yaml:1: port: 70000 is not a valid port (0-65535)"),
        ("\nnode_view: maybe\n", 'exporter.yaml:2: node_view: expected true or false, got "maybe"'),
        ("hung_after_seconds: 0\n", "exporter.yaml:1: hung_after_seconds: 0 must be greater than 0"),
        ("log_level: loud\n", 'exporter.yaml:1: log_level: "loud" is not a log level'),
        ("spool_dir: [a, b]\n", "exporter.yaml:1: spool_dir: expected a single value"),
        ("port: 1\nport: 2\n", 'exporter.yaml:2: duplicate key "port" (first on line 1)'),
        ("- port\n", "exporter.yaml:1: the config file must be a mapping of option names to values"),
        ("port: [1\n", "exporter.yaml:2: invalid YAML: "),
    ],
)
def test_file_errors_name_the_line_and_key(tmp_path, text, expected):
    assert error_of(config_file=write(tmp_path, text), env={}).startswith(f"{tmp_path}/{expected}")


def test_unreadable_file(tmp_path):
    assert error_of(config_file=tmp_path / "absent.yaml", env={}) == (
        f"{tmp_path / 'absent.yaml'}: cannot read config file: No such file or directory"
    )


def test_variables_of_the_prefix_that_are_no_options_are_left_alone(tmp_path):
    """``diagnose --user`` reads its password from NEURON_EXPORTER_PASSWORD: exported, it breaks no other command."""
    env = {"NEURON_EXPORTER_PASSWORD": "s3cret", "NEURON_EXPORTER_AUTO": "1", "NEURON_EXPORTER_CONFIG": ""}
    assert resolve_options(env=env) == Options()


def test_run_and_serve_with_the_diagnose_password_exported(tmp_path):
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT), "NEURON_EXPORTER_PASSWORD": "s3cret"}
    result = subprocess.run(
        [*CLI, "run", "--addr", "127.0.0.1", "--port", "0", "--spool-dir", str(tmp_path / "spool"), "--"]
        + [sys.executable, "-c", "import os; print(os.environ['NEURON_EXPORTER_PASSWORD'])"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (result.returncode, result.stdout) == (0, "s3cret\n"), result.stderr
    assert "unknown option" not in result.stderr
    # serve gets as far as its configuration's own checks: a port out of range, named by its flag
    refused = serve(tmp_path, "--port", "70000", env={"NEURON_EXPORTER_PASSWORD": "s3cret"})
    assert (refused.returncode, refused.stderr) == (
        2,
        "neuron-exporter serve: --port: 70000 is not a valid port (0-65535)\n",
    )


@pytest.mark.parametrize(
    "env, expected",
    [
        ({"NEURON_EXPORTER_PORT": "x"}, 'NEURON_EXPORTER_PORT: expected an integer, got "x"'),
        ({"NEURON_EXPORTER_PORT": "-1"}, "NEURON_EXPORTER_PORT: -1 is not a valid port (0-65535)"),
        (
            {"NEURON_EXPORTER_EXPIRE_AFTER_SECONDS": "soon"},
            'NEURON_EXPORTER_EXPIRE_AFTER_SECONDS: expected a number, got "soon"',
        ),
        ({"NEURON_EXPORTER_PROT": "1"}, "NEURON_EXPORTER_PROT: unknown option (known: addr, port, "),
    ],
)
def test_environment_errors_name_the_variable(env, expected):
    assert error_of(env=env).startswith(expected)


@pytest.mark.parametrize(
    "overrides, expected",
    [
        ({"port": 70000}, "option port: 70000 is not a valid port (0-65535)"),
        ({"port": True}, "option port: expected an integer, got True"),
        ({"warmup_steps": -1}, "option warmup_steps: -1 must be 0 or more"),
        ({"peak_flops": -1e14}, "option peak_flops: -1e+14 must be 0 or more"),
        ({"peak_flops": "lots"}, 'option peak_flops: expected a number, got "lots"'),
        ({"node_view": "perhaps"}, 'option node_view: expected true or false, got "perhaps"'),
        ({"prot": 1}, "option prot: unknown option (known: addr, port, "),
    ],
)
def test_override_errors_name_the_option(overrides, expected):
    assert error_of(env={}, overrides=overrides).startswith(expected)


def test_override_names_can_be_flags():
    message = error_of(env={}, overrides={"port": "x"}, override_name=lambda key: "--" + key)
    assert message == '--port: expected an integer, got "x"'


# -- the daemon's command line: a bad configuration stops it before anything starts -------------------------


@pytest.mark.parametrize(
    "case",
    [
        "unknown key",
        "wrong type in file",
        "wrong type in env",
        "wrong type in flag",
        "bad port flag",
        "bad port in file",
        "bad port in env",
        "unreadable config",
        "unreadable TLS file",
        "web config unknown key",
        "bad YAML",
    ],
)
def test_bad_configuration_is_one_line_and_exit_2(tmp_path, case):
    config = tmp_path / "exporter.yaml"
    web = tmp_path / "web.yml"
    args, env = [], {}
    if case == "unknown key":
        config.write_text("port: 19478\nprot: 9\n")
        args, expected = ["--config", str(config)], f'{config}:2: unknown key "prot"'
    elif case == "wrong type in file":
        config.write_text("hung_after_seconds: soon\n")
        args, expected = ["--config", str(config)], f'{config}:1: hung_after_seconds: expected a number, got "soon"'
    elif case == "wrong type in env":
        env, expected = (
            {"NEURON_EXPORTER_HUNG_AFTER_SECONDS": "x"},
            "NEURON_EXPORTER_HUNG_AFTER_SECONDS: expected a number",
        )
    elif case == "wrong type in flag":
        args, expected = ["--expire-after-seconds", "never"], '--expire-after-seconds: expected a number, got "never"'
    elif case == "bad port flag":
        args, expected = ["--port", "70000"], "--port: 70000 is not a valid port (0-65535)"
    elif case == "bad port in file":
        config.write_text("port: 65536\n")
        args, expected = ["--config", str(config)], f"{config}:1: port: 65536 is not a valid port"
    elif case == "bad port in env":
        env, expected = {"NEURON_EXPORTER_PORT": "99999"}, "NEURON_EXPORTER_PORT: 99999 is not a valid port"
    elif case == "unreadable config":
        args, expected = ["--config", str(tmp_path / "nope.yaml")], "nope.yaml: cannot read config file"
    elif case == "unreadable TLS file":
        web.write_text("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n")
        args, expected = (
            ["--web.config.file", str(web)],
            f'{web}:2: tls_server_config.cert_file: cannot read "server.crt"',
        )
    elif case == "web config unknown key":
        web.write_text("basic_auth_user:\n  a: b\n")
        args, expected = ["--web.config.file", str(web)], f'{web}:1: unsupported key "basic_auth_user"'
    else:
        config.write_text("port: 19478\naddr: [oops\n")
        args, expected = ["--config", str(config)], f"{config}:3: invalid YAML"
    result = serve(tmp_path, *args, env=env)
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("neuron-exporter serve: ")
    assert expected in lines[0]
    assert "Traceback" not in result.stderr and "listening" not in result.stderr


def test_children_get_the_training_packages_autostart_folder_first_and_once():
    assert (Path(AUTOSTART_DIR) / "sitecustomize.py").is_file()  # the training package says where its files are
    env = child_environment({"port": 9000, "spool_dir": None}, "run-1", AUTOSTART_DIR, environ={"PYTHONPATH": "/a"})
    assert env["PYTHONPATH"] == f"{AUTOSTART_DIR}{os.pathsep}/a"
    assert (env["NEURON_EXPORTER_PORT"], env["NEURON_EXPORTER_RUN_ID"], env["NEURON_EXPORTER_AUTO"]) == (
        "9000",
        "run-1",
        "1",
    )
    assert "NEURON_EXPORTER_SPOOL_DIR" not in env
    assert child_environment({}, "run-1", AUTOSTART_DIR, environ=env)["PYTHONPATH"] == env["PYTHONPATH"]


def test_peak_flops_is_unset_by_default_and_read_as_flop_per_second():
    assert resolve_options(env={}).peak_flops == 0
    assert resolve_options(env={"NEURON_EXPORTER_PEAK_FLOPS": "1.9e14"}).peak_flops == 1.9e14
