"""The command line's flags: ``run`` has one for every option and passes the options on to the processes it
attaches, ``serve`` one for every option the node endpoint reads; a flag a command does not know is that command's
error, with its usage, and one named after an option says how that option is set."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys

import pytest

from neuron_exporter.cli import CommandParser, run_command
from neuron_exporter.config import NODE_OPTIONS, OPTION_NAMES, OPTION_TYPES, Options, flag, resolve_options
from neuron_exporter.node import serve_command
from tests.support.paths import ROOT

CLI = [sys.executable, "-m", "neuron_exporter"]
# A value of each type, other than the default, that every option of that type accepts.
VALUES = {int: "7", float: "0.5", str | None: "0"}
TEXT = {"addr": "127.0.0.1", "spool_dir": "/tmp/x", "spool_mode": "group", "log_level": "debug"}


def parsed(*args: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    commands = parser.add_subparsers(dest="command", required=True, parser_class=CommandParser)
    serve_command.register(commands)
    run_command.register(commands)
    return parser.parse_args(list(args))


def given(namespace: argparse.Namespace) -> Options:
    overrides = {key: getattr(namespace, key) for key in namespace.option_keys}
    return resolve_options(None, {}, overrides, override_name=flag)


@pytest.mark.parametrize("key", OPTION_NAMES)
def test_run_has_a_flag_for_every_option_and_serve_for_the_node_endpoints(key):
    if OPTION_TYPES[key] is bool:
        value = str(not getattr(Options(), key)).lower()
    else:
        value = TEXT.get(key) or VALUES[OPTION_TYPES[key]]
    options = given(parsed("run", flag(key), value, "--", "true"))
    assert getattr(options, key) != getattr(Options(), key)
    assert options == resolve_options(None, {}, {key: value})
    if key in NODE_OPTIONS:
        assert getattr(given(parsed("serve", flag(key), value)), key) == getattr(options, key)


def test_a_booleans_flag_alone_means_true():
    assert given(parsed("run", "--fallback-sites", "--", "true")).fallback_sites is True
    assert given(parsed("run", "--node-view", "off", "--", "true")).node_view is False


def test_serve_takes_the_flags_of_every_option_the_node_endpoint_reads():
    """The options the node's code reads (``options.<key>``) are the ones serve has flags for."""
    node = ROOT / "neuron_exporter" / "node"
    read = {
        key
        for path in node.glob("*.py")
        if path.name != "run_command.py"  # the runner, which passes every option to its ranks
        for key in re.findall(r"\boptions\.([a-z_]+)\b", path.read_text())
    }
    assert sorted(read) == sorted(NODE_OPTIONS)


def test_run_passes_the_options_it_is_given_to_the_processes_it_attaches(tmp_path):
    (tmp_path / "exporter.yaml").write_text("max_op_series: 3\nwarmup_steps: 5\n")
    probe = (
        "from neuron_exporter.config import resolve_options; o = resolve_options(); "
        "print(o.run_id, o.warmup_steps, o.fallback_sites, o.max_op_series)"
    )
    result = subprocess.run(
        [*CLI, "run", "--addr", "127.0.0.1", "--port", "0", "--spool-dir", str(tmp_path / "spool")]
        + ["--run-id", "x", "--warmup-steps", "0", "--fallback-sites", "--config", "exporter.yaml"]
        + ["--", sys.executable, "-c", probe],
        env={"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT)},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (result.returncode, result.stdout) == (0, "x 0 True 3\n"), result.stderr  # flags over the file


def error_of(*args: str) -> str:
    result = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert (result.returncode, result.stdout) == (2, ""), result.stderr
    assert "Traceback" not in result.stderr
    return result.stderr


def test_a_flag_of_an_option_serve_does_not_use_names_its_variable_and_key():
    stderr = error_of("serve", "--warmup-steps", "0")
    assert stderr.startswith("usage: neuron-exporter serve ")
    assert stderr.splitlines()[-1] == (
        "neuron-exporter serve: error: unrecognized arguments: --warmup-steps 0; serve does not use the option "
        "warmup_steps: the training processes read it from NEURON_EXPORTER_WARMUP_STEPS or the configuration key "
        "warmup_steps, and take it from neuron-exporter run --warmup-steps"
    )


def test_an_unknown_flag_is_the_commands_error():
    stderr = error_of("run", "--run_id", "x", "--", "true")
    assert stderr.startswith("usage: neuron-exporter run ")
    assert stderr.splitlines()[-1] == (
        "neuron-exporter run: error: unrecognized arguments: --run_id (the flag of the option run_id is --run-id)"
    )
    stderr = error_of("serve", "--no-such-flag")
    assert stderr.startswith("usage: neuron-exporter serve ")
    assert stderr.splitlines()[-1] == "neuron-exporter serve: error: unrecognized arguments: --no-such-flag"
