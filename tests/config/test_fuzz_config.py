"""Fuzz: mutations of valid config files, loaded as ``serve --config`` and ``attach()`` load them.

Every mutation gives Options or a ConfigError whose message is one short printable line naming the file; nothing
else is raised.
"""

from __future__ import annotations

from dataclasses import asdict

import pytest
import yaml

from neuron_exporter.config import ConfigError, Options, resolve_options
from tests.support.fuzz import FUZZ_CASES, cases
from tests.support.paths import ROOT

LONGEST_ERROR = 700  # characters: the list of known options, the path and two quoted values at most
EVERY_OPTION = yaml.safe_dump(
    {**asdict(Options()), "web_config_file": "/etc/neuron-exporter/web.yml"}, sort_keys=False
).encode()
STYLES = b"""# quoted, flow and block styles
addr: "::"
port: 0x2505  # hexadecimal
spool_dir: '/dev/shm/neuron exporter'
node_view: off
log_level: >-
  INFO
hung_after_seconds: 1.5e+1
"""
SEEDS = [
    (ROOT / "deploy" / "systemd" / "exporter.yaml").read_bytes(),
    EVERY_OPTION,
    STYLES,
    b"{port: 9100, addr: 127.0.0.1, warmup_steps: 3}\n",
]


def test_the_seeds_are_valid(tmp_path):
    path = tmp_path / "exporter.yaml"
    for seed in SEEDS:
        path.write_bytes(seed)
        resolve_options(path, env={})


def test_fuzz_config_file(tmp_path):
    path = tmp_path / "exporter.yaml"
    loaded = 0
    for case, data in cases(SEEDS, "config", 2 * FUZZ_CASES):
        path.write_bytes(data)
        try:
            resolve_options(path, env={})
            loaded += 1
        except ConfigError as error:
            message = str(error)
            assert message.isprintable() and len(message) <= LONGEST_ERROR, (case, message[:1000])
            assert message.startswith(f"{path}"), (case, message)
        except Exception as error:  # noqa: BLE001 - any other: fail naming the case, to reproduce it
            pytest.fail(f"case {case}: {error!r:.500}")
    assert loaded > 0
