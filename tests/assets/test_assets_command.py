"""``neuron-exporter assets`` from the checkout: every format, ``--config`` through the mixin's ``files()``, and
one-line errors that write nothing. tests/end_to_end/test_packaging.py runs it from an installed wheel."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from neuron_exporter import shipped
from neuron_exporter.cli import assets_command, main
from tests.support.paths import DASHBOARDS, ROOT

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

COMMITTED_RULES = sorted((ROOT / "deploy" / "prometheus" / "rules").glob("*.yml"))


def run_cli(capsys, *args) -> tuple[int, str, str]:
    code = main(["assets", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_package_ships_what_the_command_reads():
    """The wheel carries the package, the dashboards as neuron_exporter/dashboards and, as neuron_exporter/deploy,
    exactly the files of deploy/ that DEPLOY_FILES name (pyproject.toml force-includes them)."""
    wheel = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["hatch"]["build"]["targets"]["wheel"]
    assert wheel["packages"] == ["neuron_exporter"]
    assert not wheel.get("exclude")
    assert wheel["force-include"]["dashboards"] == "neuron_exporter/dashboards"
    deploy = ROOT / "deploy"
    forced = set()
    for source, target in wheel["force-include"].items():
        if source.startswith("deploy/"):
            assert target == f"neuron_exporter/{source}"
            path = ROOT / source
            forced |= {file.relative_to(deploy).as_posix() for file in [path, *path.rglob("*")] if file.is_file()}
    named = {
        path.relative_to(deploy).as_posix() for pattern in assets_command.DEPLOY_FILES for path in deploy.glob(pattern)
    }
    assert forced == named


@pytest.mark.parametrize(
    "fmt, names",
    [
        (
            "plain",
            {
                "dashboards/training-overview.json",
                "prometheus/rules/neuron-exporter-alerts.yml",
                "prometheus/runbook.md",
                "systemd/neuron-exporter.service",
                "kubernetes/daemonset/daemonset.yaml",
            },
        ),
        ("prometheus-operator", {"prometheus-rule.yaml"}),
        (
            "grafana-configmaps",
            {"grafana-dashboard-training-overview.yaml", "grafana-dashboard-fragmentation-recompiles.yaml"},
        ),
        ("mixin", {"prometheus_alerts.yaml", "prometheus_rules.yaml", "dashboards_out/training-overview.json"}),
    ],
)
def test_each_format_writes_its_files_and_names_them(capsys, tmp_path, fmt, names):
    code, out, err = run_cli(capsys, "--output", tmp_path, "--format", fmt)
    assert code == 0 and err == ""
    written = {path.relative_to(tmp_path).as_posix() for path in tmp_path.rglob("*") if path.is_file()}
    assert names <= written
    assert sorted(out.split()) == sorted(str(tmp_path / name) for name in written)


def test_plain_files_are_the_committed_ones(capsys, tmp_path):
    assert run_cli(capsys, "--output", tmp_path)[0] == 0
    for path in COMMITTED_RULES:
        assert (tmp_path / "prometheus" / "rules" / path.name).read_text() == path.read_text()
    dashboards = sorted(DASHBOARDS.glob("*.json"))
    assert len(dashboards) >= 3
    for path in dashboards:
        assert (tmp_path / "dashboards" / path.name).read_text() == path.read_text()


def test_a_checkout_reads_its_own_folders():
    assert shipped.checkout() == ROOT
    assert (shipped.dashboards_dir(), shipped.deploy_dir()) == (ROOT / "dashboards", ROOT / "deploy")


def test_config_rebuilds_dashboards_and_rules_with_the_users_keys(capsys, tmp_path):
    pytest.importorskip("grafana_foundation_sdk", reason="the dashboards extra (Python 3.11 or later)")
    config = tmp_path / "config.yml"
    config.write_text('selector: job="training"\nfallback_severity: critical\n')
    code, _, err = run_cli(capsys, "--output", tmp_path / "out", "--format", "mixin", "--config", config)
    assert code == 0, err
    alerts = yaml.safe_load((tmp_path / "out" / "prometheus_alerts.yaml").read_text())["groups"]
    fallback = next(rule for group in alerts for rule in group["rules"] if rule["alert"] == "XlaCpuFallbackOp")
    assert fallback["labels"]["severity"] == "critical"
    assert 'job="training"' in fallback["expr"]
    for dashboard in (tmp_path / "out" / "dashboards_out").glob("*.json"):
        assert 'job=\\"training\\"' in dashboard.read_text()
    check = subprocess.run(
        [
            "promtool",
            "check",
            "rules",
            str(tmp_path / "out" / "prometheus_alerts.yaml"),
            str(tmp_path / "out" / "prometheus_rules.yaml"),
        ],
        capture_output=True,
        text=True,
    )
    assert check.returncode == 0, check.stdout + check.stderr


@pytest.mark.parametrize(
    "text, message",
    [
        ("no_such_key: 1\n", ":1: unknown configuration key 'no_such_key'"),
        ("fallback_for: soon\n", ":1: fallback_for: 'soon' is not a Prometheus duration"),
        ("- a list\n", ":1: expected a mapping of configuration keys to values"),
        ("key: [unclosed\n", ":2: invalid YAML: "),
        ("fallback_for: 5m\nfallback_for: 6m\n", ':2: duplicate key "fallback_for" (first on line 1)'),
    ],
)
def test_a_bad_config_is_one_line_exit_2_and_writes_nothing(capsys, tmp_path, text, message):
    # The configuration is checked before the generator is imported: no dashboards extra is needed for it.
    config = tmp_path / "config.yml"
    config.write_text(text)
    code, out, err = run_cli(capsys, "--output", tmp_path / "out", "--config", config)
    assert code == 2 and out == ""
    assert err.startswith(f"neuron-exporter assets: {config}{message}") and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists()


def test_a_missing_config_file_is_one_line(capsys, tmp_path):
    code, _, err = run_cli(capsys, "--output", tmp_path / "out", "--config", tmp_path / "missing.yml")
    assert code == 2 and err.count("\n") == 1 and "No such file or directory" in err


def test_config_without_the_dashboards_extra_names_it(tmp_path):
    config = tmp_path / "config.yml"
    config.write_text("fallback_for: 5m\n")
    script = (
        "import sys; sys.modules['grafana_foundation_sdk'] = None\n"  # as if it were not installed
        "from neuron_exporter.cli import main\n"
        f"sys.exit(main(['assets', '--output', {str(tmp_path / 'out')!r}, '--config', {str(config)!r}]))"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert result.returncode == 2
    assert result.stderr == (
        "neuron-exporter assets: --config needs the dashboards extra: pip install "
        "'neuron-exporter[dashboards]' (grafana-foundation-sdk, Python 3.11 or later)\n"
    )
    assert not (tmp_path / "out").exists()


def test_an_output_that_cannot_be_written_is_one_line_exit_1(capsys, tmp_path):
    (tmp_path / "file").write_text("")
    code, _, err = run_cli(capsys, "--output", tmp_path / "file")
    assert code == 1 and err.count("\n") == 1 and err.startswith("neuron-exporter assets: cannot write ")


# Kinds of the Prometheus Operator: no package of PyPI ships their CRDs' schemas, so they are checked by the tests
# of what they select (test_deploy.py) and of their rules (promtool), not by a schema.
OPERATOR_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}


def kubernetes_objects(directory) -> list[tuple[str, dict]]:
    """(file, object) of every Kubernetes object in the YAML files under ``directory``."""
    found = []
    for path in sorted(directory.rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and "apiVersion" in doc and "kind" in doc:
                found.append((path.relative_to(directory).as_posix(), doc))
    return found


def test_every_kubernetes_object_written_passes_its_schema(capsys, tmp_path):
    """The manifests of ``deploy/kubernetes`` and every format's output, against the schemas of Kubernetes, strict
    (an unknown field fails), offline."""
    kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="the test extra (kubernetes-validate)")
    for fmt in ("plain", "prometheus-operator", "grafana-configmaps"):
        assert run_cli(capsys, "--output", tmp_path / fmt, "--format", fmt)[0] == 0
    written = kubernetes_objects(tmp_path)
    kinds = {doc["kind"] for _, doc in written}
    assert kinds == {"Namespace", "DaemonSet", "Service", "Pod", "Job", "ConfigMap", *OPERATOR_KINDS}
    version = kubernetes_validate.latest_version()
    for name, doc in written:
        if doc["kind"] not in OPERATOR_KINDS:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as error:
                pytest.fail(f"{name}: {doc['kind']} {'.'.join(map(str, error.path))}: {error.message}")
    assert kubernetes_objects(ROOT / "deploy" / "kubernetes") == [
        (name.removeprefix("plain/kubernetes/"), doc) for name, doc in written if name.startswith("plain/kubernetes/")
    ]


@pytest.mark.parametrize(
    "change",
    [
        lambda d: d["spec"].update(replica=2),  # a misspelt field
        lambda d: d["spec"]["template"]["spec"]["containers"][0].update(ports=[{"containerPort": "19478"}]),
        lambda d: d["spec"]["template"]["spec"]["containers"][0].pop("image") and d["spec"].pop("selector"),
    ],
    ids=["unknown field", "port as a string", "no selector"],
)
def test_the_schema_check_refuses_a_broken_daemonset(change):
    kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="the test extra (kubernetes-validate)")
    (daemonset,) = [doc for _, doc in kubernetes_objects(ROOT / "deploy" / "kubernetes") if doc["kind"] == "DaemonSet"]
    change(daemonset)
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(daemonset, kubernetes_validate.latest_version(), strict=True)
