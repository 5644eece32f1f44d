"""What `pip install neuron-exporter` gets: the sdist and the wheel (built from the sdist, as `python -m build`
does), the wheel installed without torch into a fresh virtual environment, every command run from there, and the
assets it writes checked by promtool, loaded as Kubernetes objects and compared with the committed files.

About a minute: building runs hatchling in isolated environments. ``-m "not packaging"`` leaves it out.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
import yaml

from neuron_exporter import __version__
from tests.support.paths import DASHBOARDS, ROOT

pytestmark = pytest.mark.packaging

PROMTOOL = "/usr/bin/promtool" if os.access("/usr/bin/promtool", os.X_OK) else "promtool"
DEPENDENCIES = ("prometheus-client", "psutil", "pyyaml")  # what the wheel needs, at the versions installed here
COMMITTED_DASHBOARDS = {path.name: path.read_text() for path in sorted(DASHBOARDS.glob("*.json"))}
RULES_DIR = ROOT / "deploy" / "prometheus" / "rules"
COMMITTED_RULES = {path.name: path.read_text() for path in sorted(RULES_DIR.glob("*.yml"))}
REPORT = ROOT / "tests" / "fixtures" / "reports" / "fallback.report.txt"


def run(*command, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run([str(c) for c in command], capture_output=True, text=True, timeout=600, **kwargs)
    assert result.returncode == 0, f"{command}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("dist")
    run(sys.executable, "-m", "build", "--outdir", out, ROOT)
    (sdist,), (wheel,) = out.glob("*.tar.gz"), out.glob("*.whl")
    return {"sdist": sdist, "wheel": wheel}


@pytest.fixture(scope="module")
def venv(dist, tmp_path_factory) -> Path:
    """A fresh virtual environment with the wheel and its three dependencies: no torch, no grafana SDK."""
    venv = tmp_path_factory.mktemp("venv")
    run(sys.executable, "-m", "venv", "--without-pip", venv)
    pins = [f"{name}=={importlib.metadata.version(name)}" for name in DEPENDENCIES]
    run(
        sys.executable,
        "-m",
        "pip",
        "--python",
        venv / "bin" / "python",
        "install",
        "--quiet",
        "--no-deps",
        dist["wheel"],
        *pins,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},  # a checkout on the path is not the wheel
    )
    return venv


@pytest.fixture
def cli(venv, tmp_path):
    """Runs the installed command (or the venv's python, for ``python``) outside the checkout."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "NEURON_EXPORTER_"))}

    def call(*args, program: str = "neuron-exporter", check: bool = True, **extra_env):
        result = subprocess.run(
            [str(venv / "bin" / program), *map(str, args)],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env={**env, **extra_env},
            timeout=120,
        )
        if check:
            assert result.returncode == 0, f"{args}: {result.stderr[-3000:]}"
        return result

    return call


def source_modules() -> set[str]:
    """Every module of the checkout, by its path in the installed package."""
    return {path.relative_to(ROOT).as_posix() for path in (ROOT / "neuron_exporter").rglob("*.py")}


def test_the_wheel_holds_every_module_the_assets_and_the_metadata(dist):
    with zipfile.ZipFile(dist["wheel"]) as wheel:
        names = set(wheel.namelist())
        info = f"neuron_exporter-{__version__}.dist-info"
        metadata = wheel.read(f"{info}/METADATA").decode()
    assert source_modules() <= names
    assert {
        "neuron_exporter/py.typed",
        "neuron_exporter_autostart.pth",
        "neuron_exporter/training/autostart_path/sitecustomize.py",
        f"{info}/licenses/LICENSE",
        "neuron_exporter/deploy/prometheus/runbook.md",
        "neuron_exporter/deploy/systemd/neuron-exporter.service",
        "neuron_exporter/deploy/kubernetes/daemonset/daemonset.yaml",
        *(f"neuron_exporter/dashboards/{name}" for name in COMMITTED_DASHBOARDS),
        *(f"neuron_exporter/deploy/prometheus/rules/{name}" for name in COMMITTED_RULES),
    } <= names
    outside = ("tests/", "deploy/", "dashboards/")  # deploy/ travels as neuron_exporter/deploy
    assert not [name for name in names if "__pycache__" in name or name.startswith(outside)]
    headers = list(metadata.split("\n\n")[0].splitlines())
    assert f"Version: {__version__}" in headers
    assert "Requires-Python: >=3.10" in headers
    assert "License-Expression: Apache-2.0" in headers
    assert {f"Classifier: Programming Language :: Python :: 3.{minor}" for minor in (10, 11, 12, 13)} <= set(headers)
    assert "Project-URL: Source, https://github.com/neuron-exporter/neuron-exporter" in headers
    assert not [line for line in headers if line.startswith("Requires-Dist: torch") and "extra ==" not in line]


def test_the_sdist_holds_what_the_wheel_is_built_from_and_the_tests(dist):
    with tarfile.open(dist["sdist"]) as sdist:
        names = {name.partition("/")[2] for name in sdist.getnames()}
    assert {
        "pyproject.toml",
        "LICENSE",
        "README.md",
        "CHANGELOG.md",
        "Makefile",
        "tests/conftest.py",
        "tests/end_to_end/test_packaging.py",
        "tests/scripts/spool_writer.py",
        "examples/demo.py",
        "deploy/Dockerfile",
        "deploy/PROTOCOL.md",
        "deploy/prometheus/rules/tests/xla-alerts.yml",
        "neuron_exporter/mixin/build.py",
        "dashboards/README.md",
        *(f"dashboards/{name}" for name in COMMITTED_DASHBOARDS),
    } <= names
    assert {path.relative_to(ROOT).as_posix() for path in (ROOT / "neuron_exporter").rglob("*.py")} <= names
    assert not [name for name in names if "__pycache__" in name or name.startswith((".venv", ".git/", "build/"))]


def test_the_installed_wheel_runs_without_torch(cli):
    assert cli("-c", "import torch", program="python", check=False).returncode != 0
    help_text = cli("--help").stdout
    assert all(command in help_text for command in ("parse", "explain", "serve", "run", "assets"))
    assert cli("--version").stdout.strip() == f"neuron-exporter {__version__}"
    exposition = cli("parse", REPORT).stdout
    assert 'op="aten::lgamma"' in exposition
    check = subprocess.run([PROMTOOL, "check", "metrics"], input=exposition, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "aten::lgamma" in cli("explain", REPORT).stdout


AUTOSTART_PROBE = "import sys; print(any(type(f).__module__.startswith('neuron_exporter') for f in sys.meta_path))"


def test_the_autostart_file_reaches_site_packages(cli):
    probe = AUTOSTART_PROBE
    assert cli("-c", probe, program="python").stdout.strip() == "False"
    assert cli("-c", probe, program="python", NEURON_EXPORTER_AUTO="1").stdout.strip() == "True"
    assert cli("-c", probe, program="python", NEURON_EXPORTER_AUTO="false").stdout.strip() == "False"
    assert cli("-I", "-c", probe, program="python", NEURON_EXPORTER_AUTO="1").stdout.strip() == "False"


def test_an_editable_install_gets_the_autostart_file_too(tmp_path):
    """`pip install -e .`, as the Makefile's environments are made: the wheel's force-included .pth is in the
    editable wheel as well, so no environment needs it copied by hand."""
    venv = tmp_path / "editable"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "NEURON_EXPORTER_"))}
    run(sys.executable, "-m", "venv", "--without-pip", venv)
    python = venv / "bin" / "python"
    run(sys.executable, "-m", "pip", "--python", python, "install", "--quiet", "--no-deps", "-e", ROOT, env=env)
    purelib = Path(run(python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))").stdout.strip())
    pth = ROOT / "neuron_exporter" / "training" / "autostart_path" / "neuron_exporter_autostart.pth"
    assert (purelib / pth.name).read_text() == pth.read_text()
    on = run(python, "-c", AUTOSTART_PROBE, cwd=tmp_path, env={**env, "NEURON_EXPORTER_AUTO": "1"})
    assert on.stdout.strip() == "True"


def assets(cli, tmp_path, fmt: str) -> dict[str, str]:
    out = tmp_path / fmt
    written = cli("assets", "--output", out, "--format", fmt).stdout.split()
    files = {path.relative_to(out).as_posix(): path.read_text() for path in sorted(out.rglob("*")) if path.is_file()}
    assert sorted(written) == sorted(str(out / name) for name in files)
    return files


def promtool_check_rules(*paths: Path) -> None:
    check = subprocess.run([PROMTOOL, "check", "rules", *map(str, paths)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


def committed_groups() -> list[dict]:
    return [group for text in COMMITTED_RULES.values() for group in yaml.safe_load(text)["groups"]]


def test_plain_assets_are_the_committed_files(cli, tmp_path):
    files = assets(cli, tmp_path, "plain")
    assert {
        name.removeprefix("dashboards/"): text for name, text in files.items() if name.startswith("dashboards/")
    } == COMMITTED_DASHBOARDS
    assert {
        name.removeprefix("prometheus/rules/"): text
        for name, text in files.items()
        if name.startswith("prometheus/rules/")
    } == COMMITTED_RULES
    for name in (
        "prometheus/runbook.md",
        "prometheus/prometheus.yml",
        "systemd/neuron-exporter.service",
        "systemd/exporter.yaml",
        "kubernetes/daemonset/daemonset.yaml",
        "kubernetes/sidecar/training-job.yaml",
    ):
        assert files[name] == (ROOT / "deploy" / name).read_text(), name
    promtool_check_rules(*(tmp_path / "plain" / "prometheus" / "rules" / name for name in COMMITTED_RULES))
    check = subprocess.run(
        [PROMTOOL, "check", "config", str(tmp_path / "plain" / "prometheus" / "prometheus.yml")],
        capture_output=True,
        text=True,
    )
    assert check.returncode == 0, check.stdout + check.stderr


def test_a_prometheus_rule_for_the_operator(cli, tmp_path):
    (text,) = assets(cli, tmp_path, "prometheus-operator").values()
    rule = yaml.safe_load(text)
    assert (rule["apiVersion"], rule["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    assert rule["metadata"]["name"] == "neuron-exporter"
    assert rule["spec"]["groups"] == committed_groups()
    groups = tmp_path / "groups.yml"
    groups.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    promtool_check_rules(groups)


def test_configmaps_for_grafanas_dashboard_sidecar(cli, tmp_path):
    files = assets(cli, tmp_path, "grafana-configmaps")
    dashboards = {}
    for text in files.values():
        configmap = yaml.safe_load(text)
        assert (configmap["apiVersion"], configmap["kind"]) == ("v1", "ConfigMap")
        assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert len(configmap["metadata"]["name"]) <= 63
        dashboards.update(configmap["data"])
    assert dashboards == COMMITTED_DASHBOARDS
    assert all(json.loads(text)["uid"] for text in dashboards.values())


def test_the_mixin_layout(cli, tmp_path):
    files = assets(cli, tmp_path, "mixin")
    assert {
        name.removeprefix("dashboards_out/"): text for name, text in files.items() if name.startswith("dashboards_out/")
    } == COMMITTED_DASHBOARDS
    alerts = yaml.safe_load(files["prometheus_alerts.yaml"])["groups"]
    recording = yaml.safe_load(files["prometheus_rules.yaml"])["groups"]
    assert all("alert" in rule for group in alerts for rule in group["rules"])
    assert all("record" in rule for group in recording for rule in group["rules"])
    assert sorted(map(str, alerts + recording)) == sorted(map(str, committed_groups()))
    promtool_check_rules(tmp_path / "mixin" / "prometheus_alerts.yaml", tmp_path / "mixin" / "prometheus_rules.yaml")


def test_the_generator_never_writes_into_the_installed_package(cli, venv, tmp_path):
    """Run from a wheel, ``python -m neuron_exporter.mixin`` with its defaults has no checkout to write to: it
    says so in one line and exits 2, and the package is as installed."""
    package = Path(cli("-c", "import neuron_exporter; print(neuron_exporter.__file__)", program="python").stdout).parent
    before = sorted(path for path in package.rglob("*") if "__pycache__" not in path.parts)
    result = cli("-m", "neuron_exporter.mixin", program="python", check=False)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == f"error: {package} is an installed package, not a source checkout: give --output DIR\n"
    assert sorted(path for path in package.rglob("*") if "__pycache__" not in path.parts) == before
    assert list(tmp_path.iterdir()) == []  # nor into the current directory


def test_config_without_the_dashboards_extra_is_one_line_and_exit_2(cli, tmp_path):
    config = tmp_path / "config.yml"
    config.write_text("fallback_for: 5m\n")
    result = cli("assets", "--output", tmp_path / "out", "--config", config, check=False)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "pip install 'neuron-exporter[dashboards]'" in result.stderr
    assert not (tmp_path / "out").exists()
