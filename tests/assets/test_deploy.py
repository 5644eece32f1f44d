"""deploy/: the manifests, the systemd unit, the image and the scrape config agree with the CLI and each other."""

from __future__ import annotations

import argparse
import configparser
import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.support.http import make_certificate
from tests.support.paths import ROOT

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from neuron_exporter import __version__
from neuron_exporter.config import Options, resolve_options
from neuron_exporter.node import serve_command
from neuron_exporter.web.web_config import load_web_config

DEPLOY = ROOT / "deploy"
KUBERNETES = DEPLOY / "kubernetes"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
COMMAND = next(iter(PYPROJECT["project"]["scripts"]))  # neuron-exporter
IMAGE = f"ghcr.io/neuron-exporter/neuron-exporter:{__version__}"  # the version pyproject.toml reads


def serve_options(args: list[str], config_files: dict[str, Path] | None = None) -> Options:
    """Parse ``args`` (which must start with ``serve``) with the real CLI and resolve them as the daemon does."""
    parser = argparse.ArgumentParser(exit_on_error=False)
    serve_command.register(parser.add_subparsers(dest="command", required=True))
    parsed = parser.parse_args(args)
    assert parsed.command == "serve"
    config = (config_files or {}).get(parsed.config, parsed.config)
    return resolve_options(
        config, {}, {key: getattr(parsed, key) for key in serve_command.FLAGS}, override_name=serve_command.FLAGS.get
    )


def manifests() -> dict[str, list[dict]]:
    return {
        str(path.relative_to(KUBERNETES)): [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
        for path in sorted(KUBERNETES.rglob("*.yaml"))
    }


def objects(kind: str) -> list[dict]:
    return [doc for docs in manifests().values() for doc in docs if doc["kind"] == kind]


def pod_spec(workload: dict) -> dict:
    return workload["spec"]["template"]["spec"] if "template" in workload["spec"] else workload["spec"]


def exporter_containers(spec: dict) -> list[dict]:
    return [
        c
        for c in spec.get("containers", []) + spec.get("initContainers", [])
        if c["image"].startswith(IMAGE.split(":")[0])
    ]


def workloads() -> list[dict]:
    return [doc for docs in manifests().values() for doc in docs if doc["kind"] in ("DaemonSet", "Job", "Pod")]


def test_every_manifest_is_a_named_kubernetes_object():
    found = manifests()
    assert {
        "daemonset/daemonset.yaml",
        "daemonset/service.yaml",
        "daemonset/servicemonitor.yaml",
        "sidecar/training-job.yaml",
        "sidecar/podmonitor.yaml",
    } <= set(found)
    for name, docs in found.items():
        assert docs, name
        for doc in docs:
            assert doc.get("apiVersion") and doc.get("kind") and doc["metadata"].get("name"), name


@pytest.mark.parametrize(
    "workload",
    [w for w in workloads() if exporter_containers(pod_spec(w))],
    ids=lambda w: f"{w['kind']}/{w['metadata']['name']}",
)
def test_exporter_containers_run_the_cli_non_root_read_only_and_limited(workload):
    spec = pod_spec(workload)
    for container in exporter_containers(spec):
        assert container["image"] == IMAGE  # the released version
        assert "command" not in container  # the image's entrypoint is the CLI (see the Dockerfile test)
        options = serve_options(container["args"])
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert ports["metrics"] == options.port
        assert mount_of(options.spool_dir, container), "the spool directory must be on a mounted volume"
        security = {**spec.get("securityContext", {}), **container.get("securityContext", {})}
        assert security["runAsNonRoot"] is True and security["runAsUser"] != 0
        assert security["readOnlyRootFilesystem"] is True
        assert security["allowPrivilegeEscalation"] is False
        assert security["capabilities"]["drop"] == ["ALL"]
        for kind in ("requests", "limits"):
            assert set(container["resources"][kind]) == {"cpu", "memory"}
        for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
            if probe in container:
                assert container[probe]["httpGet"] == {"path": "/", "port": "metrics"}


def test_daemonset_shares_the_host_spool_directory_with_training_pods():
    (daemonset,) = objects("DaemonSet")
    spec = pod_spec(daemonset)
    (daemon,) = exporter_containers(spec)
    spool = serve_options(daemon["args"]).spool_dir
    volume_name = next(m["name"] for m in daemon["volumeMounts"] if m["mountPath"] == spool)
    host_path = next(v["hostPath"]["path"] for v in spec["volumes"] if v["name"] == volume_name)
    (training,) = [p for p in objects("Pod") if p["metadata"]["name"] == "training-example"]
    train = training["spec"]["containers"][0]
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in train["env"]}
    train_volume = next(m["name"] for m in train["volumeMounts"] if m["mountPath"] == env["NEURON_EXPORTER_SPOOL_DIR"])
    assert next(v["hostPath"]["path"] for v in training["spec"]["volumes"] if v["name"] == train_volume) == host_path
    assert any(t["key"] == "aws.amazon.com/neuron" for t in spec["tolerations"])


def test_service_and_servicemonitor_select_the_daemon():
    (daemonset,) = objects("DaemonSet")
    (service,) = objects("Service")
    (monitor,) = objects("ServiceMonitor")
    pod_labels = daemonset["spec"]["template"]["metadata"]["labels"]
    assert daemonset["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["metadata"]["namespace"] == daemonset["metadata"]["namespace"] == monitor["metadata"]["namespace"]
    assert service["spec"]["clusterIP"] == "None"
    (port,) = service["spec"]["ports"]
    assert port["targetPort"] == "metrics" and port["port"] == Options().port
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == [port["name"]]
    assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"


def mount_of(path: str, container: dict) -> dict | None:
    """The volume mount of ``container`` that holds ``path``."""
    for mount in container["volumeMounts"]:
        if path == mount["mountPath"] or path.startswith(mount["mountPath"].rstrip("/") + "/"):
            return mount
    return None


def test_sidecar_shares_an_in_memory_volume_and_the_podmonitor_selects_the_pod():
    (job,) = objects("Job")
    (monitor,) = objects("PodMonitor")
    spec = pod_spec(job)
    (sidecar,) = exporter_containers(spec)
    assert sidecar in spec["initContainers"] and sidecar["restartPolicy"] == "Always"  # a native sidecar
    options = serve_options(sidecar["args"])
    volume = mount_of(options.spool_dir, sidecar)["name"]
    assert next(v for v in spec["volumes"] if v["name"] == volume)["emptyDir"]["medium"] == "Memory"
    (train,) = spec["containers"]
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in train["env"]}
    assert env["NEURON_EXPORTER_SPOOL_DIR"] == options.spool_dir
    assert mount_of(options.spool_dir, train)["name"] == volume
    # An emptyDir is mode 0777: the spool is a directory the training container makes in it, readable by the
    # sidecar's user.
    assert options.spool_dir != mount_of(options.spool_dir, sidecar)["mountPath"]
    assert env["NEURON_EXPORTER_SPOOL_MODE"] == options.spool_mode == "readable"
    # every pod of the Job is one run; rank_info names the pod, namespace, node and container
    assert env["NEURON_EXPORTER_RUN_ID"] == {
        "fieldRef": {"fieldPath": "metadata.labels['batch.kubernetes.io/job-name']"}
    }
    assert {"POD_NAME", "POD_NAMESPACE", "NODE_NAME", "CONTAINER_NAME"} <= set(env)
    assert monitor["spec"]["selector"]["matchLabels"].items() <= job["spec"]["template"]["metadata"]["labels"].items()
    assert [e["port"] for e in monitor["spec"]["podMetricsEndpoints"]] == ["metrics"]


def test_dockerfile_entrypoint_is_the_cli():
    text = (DEPLOY / "Dockerfile").read_text()
    instructions = dict(re.findall(r"^(ENTRYPOINT|CMD|EXPOSE|USER) (.+)$", text, re.MULTILINE))
    assert json.loads(instructions["ENTRYPOINT"]) == [COMMAND]
    assert json.loads(instructions["CMD"]) == ["serve"]
    assert int(instructions["EXPOSE"]) == Options().port
    assert not instructions["USER"].startswith("0")
    assert "[auth]" in text
    assert IMAGE in text and IMAGE.endswith(f":{__version__}")


def test_systemd_unit_runs_the_daemon_with_the_shipped_config():
    unit = configparser.ConfigParser(strict=True, interpolation=None)
    unit.optionxform = str
    unit.read(DEPLOY / "systemd" / "neuron-exporter.service")
    service = unit["Service"]
    argv = shlex.split(service["ExecStart"])
    assert Path(argv[0]).name == COMMAND
    config = "/etc/neuron-exporter/exporter.yaml"
    options = serve_options(argv[1:], {config: DEPLOY / "systemd" / "exporter.yaml"})
    assert (options.port, options.spool_dir) == (Options().port, "/dev/shm/neuron-exporter")
    # The first rank makes the directory as its own (mode 0700); the daemon may read it and nothing else.
    assert "ExecStartPre" not in service and options.spool_mode == "private"
    assert service["AmbientCapabilities"] == service["CapabilityBoundingSet"] == "CAP_DAC_READ_SEARCH"
    assert service["DynamicUser"] == "yes"
    assert unit["Install"]["WantedBy"] == "multi-user.target"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_unit_has_no_unknown_settings(tmp_path):
    unit = tmp_path / "neuron-exporter.service"
    shutil.copy(DEPLOY / "systemd" / "neuron-exporter.service", unit)
    result = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=120)
    problems = [
        line
        for line in (result.stdout + result.stderr).splitlines()
        if line.strip() and "/usr/local/bin/neuron-exporter is not executable" not in line
    ]
    assert problems == []


def readme_section(heading: str) -> str:
    text = (DEPLOY / "README.md").read_text()
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def test_the_systemd_steps_put_the_command_where_the_unit_runs_it():
    """A venv or pipx install leaves no command in /usr/local/bin: the steps must put it where ExecStart looks,
    and outside /home and /root, which the unit hides (ProtectHome)."""
    unit = configparser.ConfigParser(strict=True, interpolation=None)
    unit.read(DEPLOY / "systemd" / "neuron-exporter.service")
    command = shlex.split(unit["Service"]["ExecStart"])[0]
    section = readme_section("systemd")
    steps = [
        shlex.split(line.removeprefix("sudo ")) for line in section.split("```sh\n")[1].split("```")[0].splitlines()
    ]
    venvs = {step[-1] for step in steps if step[:3] == ["python3", "-m", "venv"]}
    links = {step[-1]: step[-2] for step in steps if step[:1] == ["ln"] and "-s" in "".join(step[1:-2])}
    installed = {
        step[0].removesuffix("/bin/pip") for step in steps if step[0].endswith("/bin/pip") and "install" in step
    }
    assert command in links, f"no step puts {command} there"
    assert links[command] in {f"{venv}/bin/{COMMAND}" for venv in venvs & installed}
    assert not links[command].startswith(("/home/", "/root/"))
    # the unit's own comment gives the same steps
    header = (DEPLOY / "systemd" / "neuron-exporter.service").read_text()
    for step in steps[:3]:
        assert shlex.join(step) in header


def test_the_daemonset_says_how_jobs_that_are_not_root_are_served():
    """The daemon serves the spool of root and of spool_trusted_users only: a job of another user needs it set."""
    section = readme_section("Kubernetes DaemonSet")
    assert "spool_trusted_users" in section and "neuron_exporter_spool_directory_ok" in section
    manifest = (KUBERNETES / "daemonset" / "daemonset.yaml").read_text()
    (commented,) = re.findall(r"^\s*# - (--spool-trusted-users=\S+)$", manifest, flags=re.MULTILINE)
    (daemonset,) = objects("DaemonSet")
    (daemon,) = exporter_containers(pod_spec(daemonset))
    assert serve_options([*daemon["args"], commented]).spool_trusted_users == commented.split("=", 1)[1]


def test_web_config_example_loads(tmp_path):
    shutil.copy(DEPLOY / "web-config.example.yml", tmp_path / "web.yml")
    make_certificate(tmp_path)
    config = load_web_config(tmp_path / "web.yml")
    assert config.tls and list(config.users) == ["prometheus"]


def test_prometheus_config_passes_promtool():
    config = DEPLOY / "prometheus" / "prometheus.yml"
    result = subprocess.run(["promtool", "check", "config", str(config)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    parsed = yaml.safe_load(config.read_text())
    for rule_file in parsed["rule_files"]:
        assert (config.parent / rule_file).exists(), rule_file
    (job,) = [j for j in parsed["scrape_configs"] if j["job_name"] == "neuron-exporter"]
    targets = [t for c in job["static_configs"] for t in c["targets"]]
    assert all(t.endswith(f":{Options().port}") for t in targets)


def test_the_protocols_example_is_a_rank_file_a_reader_serves(tmp_path):
    """deploy/PROTOCOL.md's example header, with its exposition line, read as the endpoint reads a rank file."""
    from neuron_exporter.node.spool_format import FORMAT_VERSION, file_stem
    from neuron_exporter.node.spool_reader import read_rank_file

    text = (DEPLOY / "PROTOCOL.md").read_text()
    example = text.split("<!-- header example")[1].split("```")[1].strip().splitlines()
    header = json.loads(example[0])
    assert header["format"] == FORMAT_VERSION
    exposition = "\n".join(line.replace(": ...", "") for line in example[1:] if line != "...") + "\n"
    path = tmp_path / (file_stem(header["rank"], header["run_id"]) + ".prom")
    assert path.name == f"rank-{header['rank']}.{header['run_id']}.prom" and "`rank-R.J.prom`" in text
    path.write_text(example[0] + "\n" + exposition)
    report = read_rank_file(path)
    assert (report.meta.rank, report.meta.run_id, report.meta.pid) == ("3", "torchrun-4711", 4242)
