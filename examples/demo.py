"""`make demo`: the training example with the exporter attached, scraped by a local Prometheus with the shipped rules.

Starts Prometheus (Debian's `prometheus`) on a free loopback port with the alert and recording rules (their `for`
durations shortened, and the run's warm-up set to 0 steps, so the demo does not wait minutes), runs
examples/train.py, waits (at most --timeout seconds) until its four phases have printed and both the CPU-fallback
and the recompilation alerts fire, and prints every alert that fired. Then a data-parallel run of four ranks under
`neuron-exporter run -- torchrun --max-restarts 1` (examples/data_parallel.py), in which rank 1 reads its data
slowly and rank 2 dies: it prints each rank's restarts, recovery and work lost, and what `diagnose` says of the run
(its restart and the rank that holds it back), and the URLs. Run from a terminal, it then
keeps Prometheus and the training run going, so the URLs keep working, until Ctrl-C; otherwise (CI, a pipe) it
stops them and ends. `--keep` and `--no-keep` choose either way.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from neuron_exporter.mixin.build import rules_yaml  # noqa: E402
from neuron_exporter.mixin.config import DEFAULTS  # noqa: E402
from neuron_exporter.mixin.rules import rule_files  # noqa: E402

# What the demo waits for: the phase lines examples/train.py prints, and the alerts they should fire.
PHASES = 4
EXPECTED_ALERTS = ("XlaCpuFallbackOp", "XlaRecompilationStorm")
DEMO_THRESHOLDS = dataclasses.replace(
    DEFAULTS,
    fallback_for="0s",
    recompilation_for="0s",
    fragmentation_for="0s",
    host_reads_for="0s",
    compile_time_for="0s",
    goodput_for="0s",
    goodput_window="1m",
)


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


class PhaseLines(threading.Thread):
    """Passes the training run's output on, line by line, and counts the phases it has printed."""

    def __init__(self, stream):
        super().__init__(daemon=True)
        self.stream, self.phases = stream, 0

    def run(self) -> None:
        for line in self.stream:
            if line.startswith("phase "):
                self.phases += 1
            print(line, end="", flush=True)


def ui_prefix(prometheus: str) -> str:
    """Where Prometheus' web pages are: "/classic" for Debian's build, which has only the classic pages (its
    front page redirects there), "" for upstream builds."""

    class Keep(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None  # the redirect itself is the answer

    try:
        urllib.request.build_opener(Keep).open(f"{prometheus}/", timeout=5).close()
    except urllib.error.HTTPError as error:
        return "/classic" if error.headers.get("Location", "").startswith("/classic/") else ""
    except OSError:
        pass
    return ""


def data_parallel(work: Path, port: int, prometheus: str) -> bool:
    """examples/data_parallel.py on four ranks under `neuron-exporter run -- torchrun --max-restarts 1`, rank 1 slow and
    rank 2 dying: each rank's restarts, recovery and lost work as Prometheus last scraped them, and what `diagnose`
    says of the run once it has ended. Whether all four restarted once."""
    print(
        "\ndemo: a data-parallel run of 4 ranks under torchrun --max-restarts 1: rank 1 reads its data slowly, "
        "rank 2 dies at step 120",
        flush=True,
    )
    torchrun = [str(Path(sys.executable).parent / "torchrun"), "--standalone", "--nproc-per-node", "4"]
    torchrun += ["--max-restarts", "1", str(ROOT / "examples" / "data_parallel.py")]
    torchrun += ["--checkpoint", str(work / "checkpoint.pt"), "--slow-rank", "1", "--die-rank", "2"]
    command = [sys.executable, "-m", "neuron_exporter", "run", "--addr", "127.0.0.1", "--port", str(port)]
    command += ["--spool-dir", str(work / "spool-parallel"), "--", *torchrun]
    env = {**os.environ, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", "OMP_NUM_THREADS": "1"}
    job = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = [line for line in job.stdout if line.startswith("rank ")]  # type: ignore[union-attr]
    job.wait()
    print("".join(f"  {line}" for line in lines), end="")
    figures = {}
    for name, expr in (
        ("restarts", 'training_restarts_total{job="data-parallel"}'),
        ("recovery s", 'training_time_seconds_total{job="data-parallel", phase="recovery"}'),
        ("lost work s", 'training_lost_seconds_total{job="data-parallel"}'),
        ("tokens/s", 'rate(training_tokens_total{job="data-parallel"}[30s])'),
        ("GFLOP/s", 'rate(training_flops_total{job="data-parallel"}[30s]) / 1e9'),
    ):
        result = get_json(f"{prometheus}/api/v1/query?query=" + urllib.parse.quote(f"max by (rank) ({expr})"))
        figures[name] = {s["metric"]["rank"]: float(s["value"][1]) for s in result["data"]["result"]}
    for rank in sorted(figures["restarts"]):
        print(f"  rank {rank}: " + ", ".join(f"{name} {values.get(rank, 0):.4g}" for name, values in figures.items()))
    # The run has ended: a node endpoint on its spool shows what its ranks left there, as the daemon would.
    serve_port = free_port()
    serve = subprocess.Popen(
        [sys.executable, "-m", "neuron_exporter", "serve", "--addr", "127.0.0.1", "--port", str(serve_port)]
        + ["--spool-dir", str(work / "spool-parallel")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        diagnosed = ""
        for _ in range(50):
            diagnose = [sys.executable, "-m", "neuron_exporter", "diagnose", f"http://127.0.0.1:{serve_port}"]
            done = subprocess.run(diagnose, capture_output=True, text=True)
            if done.returncode == 0:
                diagnosed = done.stdout
                break
            time.sleep(0.2)
    finally:
        serve.terminate()
        serve.wait()
    print("  diagnose:\n" + "".join(f"    {line}\n" for line in diagnosed.splitlines()[1:5]), end="")
    return job.returncode == 0 and set(figures["restarts"].values()) == {1.0}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--keep",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="keep Prometheus and the training run going until Ctrl-C (default: when standard input is a terminal)",
    )
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for the alerts")
    args = parser.parse_args()
    keep = sys.stdin.isatty() if args.keep is None else args.keep
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the children too (the finally below)
    if shutil.which("prometheus") is None:
        print("demo: the `prometheus` command is missing (make demo installs Debian's package)", file=sys.stderr)
        return 2

    work = ROOT / ".demo"
    shutil.rmtree(work, ignore_errors=True)
    (work / "rules").mkdir(parents=True)
    for name, content in rule_files(DEMO_THRESHOLDS).items():
        (work / "rules" / name).write_text(rules_yaml(content))
    exporter_port, prometheus_port, parallel_port = free_port(), free_port(), free_port()
    (work / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f"rule_files: ['{work}/rules/*.yml']\n"
        "scrape_configs:\n"
        "  - job_name: neuron-exporter\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{exporter_port}']}}]\n"
        "  - job_name: data-parallel\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{parallel_port}']}}]\n"
    )
    prometheus_url = f"http://127.0.0.1:{prometheus_port}"
    prometheus = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={work / 'prometheus.yml'}",
            f"--storage.tsdb.path={work / 'data'}",
            f"--web.listen-address=127.0.0.1:{prometheus_port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=open(work / "prometheus.log", "w"),
        start_new_session=True,
    )
    # Sessions of their own: Ctrl-C reaches only this script, which stops them in order.
    # The demo's run counts recompilations from its first step: the rules count a rank once it had made
    # warmup_steps steps at the first sample of their 5-minute window, and Prometheus' first sample of a run that
    # has just started is 0 steps.
    training = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "examples" / "train.py"),
            "--port",
            str(exporter_port),
            "--continue-for",
            "inf" if keep else "3600",
        ],
        # A spool of its own: the endpoint would serve every other run on this machine's default spool too.
        env={**os.environ, "NEURON_EXPORTER_WARMUP_STEPS": "0", "NEURON_EXPORTER_SPOOL_DIR": str(work / "spool")},
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    output = PhaseLines(training.stdout)
    output.start()
    try:
        print(f"demo: Prometheus at {prometheus_url} (log: {work / 'prometheus.log'})", flush=True)
        deadline = time.monotonic() + args.timeout
        fired: dict[tuple, dict] = {}  # alerts seen firing, by name and labels

        def watch() -> set[str]:
            for alert in firing_alerts(prometheus_url):
                fired[tuple(sorted(alert["labels"].items()))] = alert
            return set(EXPECTED_ALERTS) - {alert["labels"]["alertname"] for alert in fired.values()}

        while (watch() or output.phases < PHASES) and time.monotonic() < deadline and training.poll() is None:
            time.sleep(1)
        time.sleep(3)  # one more evaluation round, for the alerts that need two samples of a rate
        missing = watch()
        print("\ndemo: alerts that fired in Prometheus:")
        for _, alert in sorted(fired.items()):
            labels = ", ".join(f'{k}="{v}"' for k, v in sorted(alert["labels"].items()) if k != "alertname")
            print(f"  {alert['labels']['alertname']} {{{labels}}}\n      {alert['annotations'].get('summary', '')}")
        if output.phases < PHASES or missing:
            print(
                f"demo: after {args.timeout:g} s, {output.phases} of {PHASES} phases have printed"
                + (f" and {', '.join(sorted(missing))} has not fired" if missing else "")
                + f" (Prometheus log: {work / 'prometheus.log'})",
                file=sys.stderr,
            )
        parallel_ok = data_parallel(work, parallel_port, prometheus_url)
        print(
            "\ndemo: Prometheus and the training run keep going until Ctrl-C:"
            if keep
            else "\ndemo: these answer until the demo ends, which is now (from a terminal, or with --keep, "
            "they stay until Ctrl-C):"
        )
        pages = prometheus_url + ui_prefix(prometheus_url)
        print(
            f"  exporter metrics:  http://127.0.0.1:{exporter_port}/metrics\n"
            f"  Prometheus alerts: {pages}/alerts\n"
            f"  a query:           {pages}/graph?g0.expr="
            f"{urllib.parse.quote('topk(5, rate(xla_cpu_fallback_ops_total[1m]))')}\n"
            f"  dashboards:        import dashboards/*.json into Grafana (see its README.md)"
        )
        sys.stdout.flush()
        if not keep:
            return 1 if output.phases < PHASES or missing or not parallel_ok else 0
        while training.poll() is None and prometheus.poll() is None:
            time.sleep(1)
        ended = "the training run" if training.poll() is not None else "Prometheus"
        print(
            f"demo: {ended} ended by itself, so the URLs above no longer answer (Prometheus log: "
            f"{work / 'prometheus.log'})",
            file=sys.stderr,
        )
        return 1
    except KeyboardInterrupt:
        print("\ndemo: stopped", flush=True)
        return 0
    finally:
        for process in (training, prometheus):
            process.terminate()
            process.wait()


if __name__ == "__main__":
    sys.exit(main())
