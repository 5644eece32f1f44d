"""`make demo`: the training example with the exporter attached, scraped by a local Prometheus with the shipped rules.

Starts Prometheus (Debian's `prometheus`) on a free loopback port with the alert and recording rules (their `for`
durations shortened so the demo does not wait minutes), runs examples/train.py, waits until the CPU-fallback
alert fires, and prints what fired and the URLs. `--keep` leaves everything running until Ctrl-C.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dashboards.build import rules_yaml  # noqa: E402
from dashboards.config import DEFAULTS  # noqa: E402
from dashboards.rules import rule_files  # noqa: E402

DEMO_THRESHOLDS = dataclasses.replace(
    DEFAULTS, fallback_for="0s", recompilation_for="0s", fragmentation_for="0s", host_reads_for="0s",
    compile_time_for="0s")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str):
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.load(response)


def firing_alerts(prometheus: str) -> list[dict]:
    try:
        alerts = get_json(f"{prometheus}/api/v1/alerts")["data"]["alerts"]
    except OSError:
        return []
    return [a for a in alerts if a["state"] == "firing"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", action="store_true", help="keep Prometheus and the exporter running until Ctrl-C")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for the alerts")
    args = parser.parse_args()
    if shutil.which("prometheus") is None:
        print("demo: the `prometheus` command is missing (make demo installs Debian's package)", file=sys.stderr)
        return 2

    work = ROOT / ".demo"
    shutil.rmtree(work, ignore_errors=True)
    (work / "rules").mkdir(parents=True)
    for name, content in rule_files(DEMO_THRESHOLDS).items():
        (work / "rules" / name).write_text(rules_yaml(content))
    exporter_port, prometheus_port = free_port(), free_port()
    (work / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f"rule_files: ['{work}/rules/*.yml']\n"
        "scrape_configs:\n"
        "  - job_name: neuron-exporter\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{exporter_port}']}}]\n")
    prometheus_url = f"http://127.0.0.1:{prometheus_port}"
    prometheus = subprocess.Popen(
        ["prometheus", f"--config.file={work / 'prometheus.yml'}", f"--storage.tsdb.path={work / 'data'}",
         f"--web.listen-address=127.0.0.1:{prometheus_port}"],
        stdout=subprocess.DEVNULL, stderr=open(work / "prometheus.log", "w"))
    training = subprocess.Popen(
        [sys.executable, str(ROOT / "examples" / "train.py"), "--port", str(exporter_port), "--continue-for", "3600"])
    try:
        print(f"demo: Prometheus at {prometheus_url} (log: {work / 'prometheus.log'})", flush=True)
        deadline = time.monotonic() + args.timeout
        firing: list[dict] = []
        while time.monotonic() < deadline and training.poll() is None:
            firing = firing_alerts(prometheus_url)
            if any(a["labels"].get("alertname") == "XlaCpuFallbackOp" for a in firing):
                break
            time.sleep(1)
        time.sleep(3)  # one more evaluation round, for the alerts that need two samples of a rate
        firing = firing_alerts(prometheus_url)
        print("\ndemo: alerts firing in Prometheus:")
        for alert in sorted(firing, key=lambda a: a["labels"]["alertname"]):
            labels = ", ".join(f'{k}="{v}"' for k, v in sorted(alert["labels"].items()) if k != "alertname")
            print(f"  {alert['labels']['alertname']} {{{labels}}}\n      {alert['annotations'].get('summary', '')}")
        if not firing:
            print("  none yet (see the Prometheus log)")
        print(f"\n  exporter metrics:  http://127.0.0.1:{exporter_port}/metrics\n"
              f"  Prometheus alerts: {prometheus_url}/alerts\n"
              f"  a query:           {prometheus_url}/graph?g0.expr="
              f"{urllib.parse.quote('topk(5, rate(xla_cpu_fallback_ops_total[1m]))')}\n"
              f"  dashboards:        import dashboards/*.json into Grafana (see dashboards/README.md)")
        if args.keep:
            print("\ndemo: running until Ctrl-C")
            training.wait()
        return 0 if firing else 1
    except KeyboardInterrupt:
        return 0
    finally:
        for process in (training, prometheus):
            process.terminate()
            process.wait()


if __name__ == "__main__":
    sys.exit(main())
