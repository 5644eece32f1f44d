"""``neuron-exporter serve`` as a process: serving the spool, precedence of settings, signals, a real Prometheus."""

from __future__ import annotations

import configparser
import os
import signal
import stat
import subprocess

import pytest
import yaml

from tests.support.daemon import Daemon, free_port
from tests.support.exposition import scrape, value
from tests.support.paths import ROOT
from tests.support.processes import wait_until
from tests.support.prometheus import running_prometheus
from tests.support.spool_writer import Writer


def test_serves_every_rank_of_the_spool(tmp_path, daemons):
    spool = tmp_path / "spool"
    with Writer(spool, "0-3", "--steps", "12", "--ops", "4"):
        daemon = Daemon(tmp_path, "--addr", "127.0.0.1", "--port", "0", "--spool-dir", str(spool))
        daemons(daemon)
        text = scrape(daemon.url)
    assert [value(text, "xla_steps_total", rank=str(r)) for r in range(4)] == [12] * 4
    assert [value(text, "neuron_exporter_rank_up", rank=str(r)) for r in range(4)] == [1] * 4
    assert value(text, "neuron_exporter_ranks") == 4
    result = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert daemon.stop() == 0


def test_ranks_that_start_after_the_daemon_appear(tmp_path, daemons):
    spool = tmp_path / "not-yet"
    daemon = Daemon(tmp_path, "--addr", "127.0.0.1", "--port", "0", "--spool-dir", str(spool))
    daemons(daemon)
    assert value(scrape(daemon.url), "neuron_exporter_ranks") == 0
    assert not spool.exists()  # in the default (private) mode the first rank makes the directory, as its own
    with Writer(spool, "0,1", "--steps", "3"):
        assert stat.S_IMODE(spool.stat().st_mode) == 0o700
        text = scrape(daemon.url)
        assert value(text, "neuron_exporter_ranks") == 2
        assert value(text, "xla_steps_total", rank="1") == 3
    assert daemon.stop(signal.SIGINT) == 0


def test_in_the_shared_mode_the_daemon_makes_the_directory_like_tmp(tmp_path, daemons):
    spool = tmp_path / "shared"
    daemons(Daemon(tmp_path, "--addr", "127.0.0.1", "--port", "0", "--spool-dir", str(spool), "--spool-mode", "shared"))
    assert stat.S_IMODE(spool.stat().st_mode) == 0o1777


@pytest.mark.parametrize("mode", [0o777, 0o775])
def test_a_directory_others_can_write_keeps_the_daemon_up_saying_so(tmp_path, daemons, mode):
    spool = tmp_path / "open"
    spool.mkdir()
    spool.chmod(mode)
    with Writer(tmp_path / "good", "0"):  # a rank file, laid in the open directory by anyone
        (tmp_path / "good").chmod(0o700)
        for rank_file in (tmp_path / "good").iterdir():
            os.link(rank_file, spool / rank_file.name)
        daemon = Daemon(tmp_path, "--addr", "127.0.0.1", "--port", "0", "--spool-dir", str(spool))
        daemons(daemon)
        text = scrape(daemon.url)
    assert value(text, "neuron_exporter_spool_directory_ok") == 0
    assert value(text, "xla_steps_total") is None and value(text, "neuron_exporter_ranks") == 0
    refused = [line for line in daemon.log.read_text().splitlines() if "is writable by" in line]
    assert len(refused) == 1 and str(spool) in refused[0]
    spool.chmod(0o700)  # fixed: served from the next scrape on, without a restart
    assert value(scrape(daemon.url), "neuron_exporter_spool_directory_ok") == 1
    assert daemon.stop() == 0


def test_the_shipped_unit_restarts_the_daemon_whatever_stopped_it():
    unit = configparser.ConfigParser(strict=True, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read(ROOT / "deploy" / "systemd" / "neuron-exporter.service")
    assert unit["Service"]["Restart"] in ("on-failure", "always")
    assert "RestartPreventExitStatus" not in unit["Service"] and "SuccessExitStatus" not in unit["Service"]
    assert unit["Unit"]["StartLimitIntervalSec"] == "0"  # systemd never gives up on it


def test_the_shipped_alert_fires_on_an_unsafe_spool_directory(tmp_path, daemons):
    spool = tmp_path / "open"
    spool.mkdir()
    spool.chmod(0o777)
    daemon = Daemon(tmp_path, "--addr", "127.0.0.1", "--port", "0", "--spool-dir", str(spool))
    daemons(daemon)
    ok = value(scrape(daemon.url), "neuron_exporter_spool_directory_ok")
    labels = 'job="neuron-exporter",instance="node-1:19478"'
    test = {
        "rule_files": [str(ROOT / "deploy" / "prometheus" / "rules" / "neuron-exporter-alerts.yml")],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": f"neuron_exporter_spool_directory_ok{{{labels}}}", "values": f"{ok:g}x30"}],
                "alert_rule_test": [{"eval_time": "30m", "alertname": "NeuronExporterSpoolDirectoryNotOk"}],
            }
        ],
    }
    (tmp_path / "test.yml").write_text(yaml.safe_dump(test))
    result = subprocess.run(["promtool", "test", "rules", str(tmp_path / "test.yml")], capture_output=True, text=True)
    # promtool fails the test when the alert fires but the test expects none: that failure is the proof it fires.
    assert result.returncode == 1 and "NeuronExporterSpoolDirectoryNotOk" in result.stdout + result.stderr
    assert 'alertname="NeuronExporterSpoolDirectoryNotOk"' in result.stdout + result.stderr


def test_flags_override_environment_override_file(tmp_path, daemons):
    file_port, env_port, flag_port = free_port(), free_port(), free_port()
    config = tmp_path / "exporter.yaml"
    config.write_text(f"addr: 127.0.0.1\nport: {file_port}\nspool_dir: {tmp_path / 'spool'}\n")
    env = {"NEURON_EXPORTER_PORT": str(env_port)}
    first = Daemon(tmp_path, "--config", str(config))
    daemons(first)
    assert first.port == file_port
    assert first.stop() == 0
    second = Daemon(tmp_path, "--config", str(config), env=env)
    daemons(second)
    assert second.port == env_port
    assert second.stop() == 0
    third = Daemon(tmp_path, "--config", str(config), "--port", str(flag_port), env=env)
    daemons(third)
    assert third.port == flag_port
    assert third.stop() == 0


@pytest.mark.prometheus
def test_a_real_prometheus_scrapes_the_daemon_with_the_shipped_config(tmp_path, daemons):
    spool = tmp_path / "spool"
    with Writer(spool, "0,1", "--steps", "6", "--rewrite", "0.5"):
        daemon = Daemon(tmp_path, "--addr", "127.0.0.1", "--port", "0", "--spool-dir", str(spool))
        daemons(daemon)
        shipped = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
        shipped["global"]["scrape_interval"] = "1s"
        shipped["global"]["evaluation_interval"] = "1s"
        shipped["rule_files"] = [str(ROOT / "deploy" / "prometheus" / f) for f in shipped["rule_files"]]
        (job,) = shipped["scrape_configs"]
        job["static_configs"] = [{"targets": [f"127.0.0.1:{daemon.port}"]}]
        with running_prometheus(shipped, tmp_path) as prometheus:
            up = wait_until(lambda: prometheus.by_rank('up{job="neuron-exporter"}'), timeout=120, what="a scrape")
            assert up == {None: 1.0}
            ranks = wait_until(lambda: prometheus.by_rank("neuron_exporter_rank_up"), timeout=60, what="rank series")
            assert ranks == {"0": 1.0, "1": 1.0}
            steps = wait_until(lambda: prometheus.by_rank("xla_steps_total"), timeout=60, what="steps in Prometheus")
            assert set(steps) == {"0", "1"} and min(steps.values()) >= 6
    assert daemon.stop() == 0
