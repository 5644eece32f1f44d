"""``neuron-exporter assets --output DIR``: the Grafana dashboards, the Prometheus rules and their runbook, and the
deployment files (systemd unit, Kubernetes manifests, scrape config) that come with the package, written out as
plain files or in the form a monitoring stack loads:

- ``plain``: the files as the package ships them: ``dashboards/*.json``, ``prometheus/rules/*.yml``,
  ``prometheus/runbook.md``, ``prometheus/prometheus.yml``, ``systemd/``, ``kubernetes/``, ``web-config.example.yml``;
- ``prometheus-operator``: ``prometheus-rule.yaml``, one ``PrometheusRule`` (monitoring.coreos.com/v1) holding every
  rule group;
- ``grafana-configmaps``: ``grafana-dashboard-<name>.yaml``, one ``ConfigMap`` per dashboard labelled
  ``grafana_dashboard: "1"``, which Grafana's dashboard sidecar (kube-prometheus-stack) loads;
- ``mixin``: ``prometheus_alerts.yaml``, ``prometheus_rules.yaml`` and ``dashboards_out/*.json``, the layout of a
  built monitoring mixin.

``--config FILE`` builds the dashboards and rules anew from the mixin configuration in FILE (a YAML mapping of the
keys of mixin/config.py in this package: selectors, labels, severities, thresholds); that needs the
``dashboards`` extra.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from pathlib import Path

from .. import __version__, shipped
from ..config_file import ConfigError, dump_yaml
from ..untrusted import EXIT_USAGE

FORMATS = ("plain", "prometheus-operator", "grafana-configmaps", "mixin")
# What the package ships of deploy/ (pyproject.toml force-includes the same files in the wheel; ``shipped`` finds
# them).
DEPLOY_FILES = (
    "prometheus/prometheus.yml",
    "prometheus/rules/*.yml",
    "prometheus/runbook.md",
    "systemd/*",
    "kubernetes/*/*.yaml",
    "web-config.example.yml",
)
DASHBOARDS_DIR = shipped.DASHBOARDS
RULES_DIR = "prometheus/rules"
NAME = "neuron-exporter"
EXTRA_MISSING = (
    "--config needs the dashboards extra: pip install 'neuron-exporter[dashboards]' "
    "(grafana-foundation-sdk, Python 3.11 or later)"
)


class AssetsError(Exception):
    """A mistake of the user's, told in one line; ``code`` is the exit code."""

    def __init__(self, message: str, code: int = EXIT_USAGE):
        super().__init__(message)
        self.code = code


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "assets",
        help="write out the Grafana dashboards, Prometheus rules and deployment files",
        description="Write the Grafana dashboards, the Prometheus rules and their runbook, the systemd unit and the "
        "Kubernetes manifests that come with neuron-exporter into DIR, as plain files or as Kubernetes "
        "objects for the Prometheus Operator and Grafana's dashboard sidecar.",
    )
    parser.add_argument(
        "--output",
        "-o",
        metavar="DIR",
        required=True,
        type=Path,
        help="directory to write to (made if missing; files of the same name are replaced)",
    )
    parser.add_argument(
        "--format",
        choices=FORMATS,
        default="plain",
        help="plain files (default); a PrometheusRule; ConfigMaps labelled grafana_dashboard=1; or "
        "the layout of a monitoring mixin (prometheus_alerts.yaml, prometheus_rules.yaml, "
        "dashboards_out/)",
    )
    parser.add_argument(
        "--config",
        metavar="FILE",
        type=Path,
        help="rebuild the dashboards and rules with this mixin configuration (YAML: selector, "
        "aggregation_labels, severities, thresholds; see neuron_exporter/mixin/config.py); needs the "
        "dashboards extra",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        files = render(args.format, args.config)
        written = write(args.output, files)
    except AssetsError as error:
        print(f"neuron-exporter assets: {error}", file=sys.stderr)
        return error.code
    for path in written:
        print(path)
    return 0


def shipped_files() -> dict[str, str]:
    """Every file the package ships, by its path in the plain layout."""
    dashboards, deploy = shipped.dashboards_dir(), shipped.deploy_dir()
    paths = {f"{DASHBOARDS_DIR}/{path.name}": path for path in sorted(dashboards.glob("*.json"))}
    for pattern in DEPLOY_FILES:
        paths.update((path.relative_to(deploy).as_posix(), path) for path in sorted(deploy.glob(pattern)))
    if not any(name.startswith(f"{DASHBOARDS_DIR}/") for name in paths) or not any(
        name.startswith(f"{RULES_DIR}/") for name in paths
    ):
        raise AssetsError(
            f"the dashboards or rules are missing from {shipped.root()}: reinstall neuron-exporter", code=1
        )
    return {name: path.read_text(encoding="utf-8") for name, path in paths.items()}


def load_config(path: Path):
    """The mixin configuration in a YAML file, checked by the generator's own reader (which needs no extra)."""
    from ..mixin import config

    try:
        return config.load_config(path)
    except ConfigError as error:
        raise AssetsError(str(error)) from None


def generated_files(config) -> dict[str, str]:
    """The dashboards and rule files built with ``config``, by their paths in the plain layout."""
    from ..mixin import build

    try:
        generated = build.files(config)
    except build.ExtraMissing:
        raise AssetsError(EXTRA_MISSING) from None
    deploy = f"{shipped.DEPLOY}/"  # the generator's paths are the repository's; the plain layout is deploy/'s
    return {name.removeprefix(deploy): text for name, text in generated.items()}


def render(format_: str, config_path: Path | None = None) -> dict[str, str]:
    """The files of ``format_`` (one of FORMATS) by their paths relative to the output directory."""
    files = shipped_files()
    if config_path is not None:
        generated = generated_files(load_config(config_path))
        files = {
            name: text for name, text in files.items() if not name.startswith((f"{DASHBOARDS_DIR}/", f"{RULES_DIR}/"))
        }
        files.update(generated)
    if format_ == "plain":
        return files
    dashboards = {
        name.rpartition("/")[2]: text
        for name, text in files.items()
        if name.startswith(f"{DASHBOARDS_DIR}/") and name.endswith(".json")
    }
    groups = [
        group
        for name, text in sorted(files.items())
        if name.startswith(f"{RULES_DIR}/")
        for group in _yaml_load(text).get("groups", [])
    ]
    if format_ == "prometheus-operator":
        return {"prometheus-rule.yaml": prometheus_rule(groups)}
    if format_ == "grafana-configmaps":
        return {
            f"grafana-dashboard-{Path(name).stem}.yaml": dashboard_configmap(name, text)
            for name, text in dashboards.items()
        }
    if format_ == "mixin":
        alerts = [g for g in groups if any("alert" in rule for rule in g.get("rules", []))]
        recording = [g for g in groups if g not in alerts]
        return {
            "prometheus_alerts.yaml": _yaml_dump({"groups": alerts}),
            "prometheus_rules.yaml": _yaml_dump({"groups": recording}),
            **{f"dashboards_out/{name}": text for name, text in dashboards.items()},
        }
    raise AssetsError(f"unknown format {format_!r} (known: {', '.join(FORMATS)})")


def prometheus_rule(groups: list) -> str:
    return _yaml_dump(
        {
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "PrometheusRule",
            "metadata": {"name": NAME, "labels": {"app.kubernetes.io/name": NAME}},
            "spec": {"groups": groups},
        }
    )


def dashboard_configmap(name: str, text: str) -> str:
    return _yaml_dump(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": f"{NAME}-dashboard-{Path(name).stem}",
                "labels": {"grafana_dashboard": "1", "app.kubernetes.io/name": NAME},
            },
            "data": {name: text},
        }
    )


def write(directory: Path, files: Mapping[str, str]) -> list[Path]:
    written = []
    for name, text in files.items():
        path = directory / name
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        except OSError as error:
            raise AssetsError(f"cannot write {path}: {error.strerror or error}", code=1) from None
        written.append(path)
    return written


def _yaml_load(text: str):
    import yaml

    return yaml.safe_load(text) or {}


def _yaml_dump(content: dict) -> str:
    header = f"# Written by `neuron-exporter assets` {__version__}; regenerate it rather than edit it.\n"
    return header + dump_yaml(content)
