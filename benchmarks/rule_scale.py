"""How long the shipped rule groups take at 2,048 ranks: 16 nodes of 128 ranks, scraped and evaluated by a real
Prometheus (2.42, installed) with the shipped rules (deploy/prometheus/rules) every 15 s, their shipped intervals.

Every rank serves the series a real rank serves: the script first runs examples/train.py (torch_xla on the CPU
device: graph cuts, a CPU fallback, recompilations, so every family has its sites) and scrapes its endpoint once;
that exposition, each rank's copy with its own run, rank and local rank, is what 16 node endpoints serve (one HTTP
server, a path per node), counters growing from each rank's start. Training time splits as a run that trains 80%
of the time; rank 1000 waits 0.2 s more a second for data than the others (the straggler, which the others wait
for in their steps), and the 128 ranks of node 5 restart at --restart-minute: their processes end, the node serves
their last values for a minute, then the next processes start their own counters again (steps, CPU time, torch_xla's)
and go on from the run's (training time, with a minute of recovery and another start-up; 240 s of lost work, the
steps since the checkpoint they resume from; a restart). Every other rank serves its restarts, lost work and
recovery at 0, as a rank of a run that never restarted does.

After --minutes (the longest window of the rules is 30m: wait it out), it polls the rules API for the last
--measure-minutes and prints, per rule group, how many evaluations it saw and their durations (median, 90th
percentile, largest) against the 15 s interval, the slowest rules, the iterations Prometheus missed, the
TrainingStraggler alerts, the run's goodput over its life beside what the model of the run gives, and how long
the Run health row's queries take over the last hour.

    python benchmarks/rule_scale.py [--nodes 16] [--ranks-per-node 128] [--minutes 36] [--measure-minutes 6]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from neuron_exporter.catalogue import TRAINING_LOST, TRAINING_RESTARTS, TRAINING_TIME  # noqa: E402
from tests.support.daemon import free_port  # noqa: E402
from tests.support.processes import xla_env  # noqa: E402
from tests.support.prometheus import (  # noqa: E402
    Prometheus,
    dashboard_variables,
    running_prometheus,
    substitute_variables,
)

RULES = ROOT / "deploy" / "prometheus" / "rules"
EXAMPLE = ROOT / "examples" / "train.py"
INTERVAL = 15.0  # seconds: the shipped scrape and evaluation intervals
RUN = "bench-2048"
STRAGGLER = 1000
RESTARTING_NODE = 5
# Seconds of each second of a rank's training thread, by phase; the straggler's data takes 0.2 more from its step.
PHASES = {"step": 0.80, "data": 0.06, "compile": 0.04, "host_sync": 0.03, "checkpoint": 0.02, "other": 0.0}
STEPS_PER_SECOND = 2.0
STARTUP_SECONDS = 30.0
# A restart of node 5's ranks: the seconds between a process's end and the next one's start, and the step time of
# the steps the next one does again (5 minutes of steps since the last checkpoint).
RECOVERY_SECONDS = 60.0
LOST_SECONDS = 0.80 * 300
# What a rank carries across its restarts (the run's counters), and what its next process adds to them when it
# starts: another start-up, the recovery, the lost work, a restart.
CARRIED = (TRAINING_TIME.name, TRAINING_LOST.name, TRAINING_RESTARTS.name)
ON_RESTART = {"startup": STARTUP_SECONDS, "recovery": RECOVERY_SECONDS, TRAINING_LOST.name: LOST_SECONDS,
              TRAINING_RESTARTS.name: 1.0}  # fmt: skip


def template_exposition(work: Path) -> str:
    """The node endpoint's exposition of a real torch_xla rank, once its four phases have run."""
    port = free_port()
    log = work / "example.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [sys.executable, str(EXAMPLE), "--port", str(port), "--continue-for", "600"],
            env=xla_env(NEURON_EXPORTER_SPOOL_DIR=str(work / "spool")),  # its ranks alone, not the machine's
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 600
        while "then:" not in log.read_text():
            if process.poll() is not None or time.monotonic() > deadline:
                sys.exit(f"examples/train.py did not get through its phases:\n{log.read_text()[-3000:]}")
            time.sleep(1)
        time.sleep(INTERVAL)  # its spool and the node view catch up with the last phase
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
            exposition = response.read().decode()
        ranks = {(s.labels["run_id"], s.labels["rank"]) for f in text_string_to_metric_families(exposition)
                 for s in f.samples if "rank" in s.labels}  # fmt: skip
        if len(ranks) != 1:
            sys.exit(f"examples/train.py's endpoint served {len(ranks)} ranks, not its own alone")
        return exposition
    finally:
        process.terminate()
        process.wait(timeout=60)


class Line:
    """One series of a node's exposition: its text before the value, and the value as a function of the rank's
    uptime (``base + slope * uptime``; gauges have no slope). A ``carried`` series is the run's: a restarted rank's
    next process goes on from its value, adding ``on_restart``; the others start again."""

    __slots__ = ("prefix", "base", "slope", "rank", "name", "phase", "carried", "on_restart")

    def __init__(self, prefix: str, base: float, slope: float, rank: int | None, name: str = "", phase: str = ""):
        self.prefix, self.base, self.slope, self.rank = prefix, base, slope, rank
        self.name, self.phase = name, phase
        self.carried = name in CARRIED
        self.on_restart = ON_RESTART.get(phase or name, 0.0) if self.carried else 0.0


def label_text(labels: dict[str, str]) -> str:
    def escape(value: str) -> str:
        return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    return "{" + ",".join(f'{k}="{escape(v)}"' for k, v in labels.items()) + "}" if labels else ""


def node_lines(exposition: str, node: int, ranks_per_node: int, uptime: float) -> list[Line]:
    """The series node ``node`` serves: the template's per-rank series for each of its ranks, its node series
    once. Counters grow at the rate that brought them to their template value in ``uptime`` seconds; the training
    time, steps and CPU time are those of the module's model of a run."""
    lines = []
    rank_labels: dict[int, dict[str, str]] = {}
    for family in text_string_to_metric_families(exposition):
        counter = family.type in ("counter", "histogram", "summary")
        for sample in family.samples:
            if sample.name.endswith("_created") or sample.name in (TRAINING_LOST.name, TRAINING_RESTARTS.name):
                continue  # the restart's series are the model's, below, whether the template serves them or not
            if sample.name == TRAINING_TIME.name and sample.labels["phase"] not in (*PHASES, "startup"):
                continue  # recovery, below
            per_rank = "rank" in sample.labels
            for local in range(ranks_per_node) if per_rank else [None]:
                labels = dict(sample.labels)
                rank = None
                if local is not None:
                    rank = node * ranks_per_node + local
                    labels.update(run_id=RUN, rank=str(rank), local_rank=str(local))
                base, slope = sample.value, (sample.value / uptime if counter else 0.0)
                phase = ""
                if sample.name == TRAINING_TIME.name:
                    phase = labels["phase"]
                    base, slope = (STARTUP_SECONDS, 0.0) if phase == "startup" else (0.0, PHASES[phase])
                    if rank == STRAGGLER and phase in ("data", "step"):
                        slope += 0.2 if phase == "data" else -0.2
                elif sample.name in ("training_steps_total", "xla_steps_total"):
                    base, slope = 0.0, STEPS_PER_SECOND
                    if sample.name == "training_steps_total" and rank is not None:
                        rank_labels[rank] = {k: v for k, v in labels.items() if k != "phase"}
                elif sample.name == "training_process_cpu_seconds_total":
                    base, slope = 0.0, 0.5
                lines.append(Line(sample.name + label_text(labels), base, slope, rank, sample.name, phase))
    for rank, labels in rank_labels.items():
        recovery = {**labels, "phase": "recovery"}
        lines.append(Line(TRAINING_TIME.name + label_text(recovery), 0.0, 0.0, rank, TRAINING_TIME.name, "recovery"))
        for name in (TRAINING_LOST.name, TRAINING_RESTARTS.name):
            lines.append(Line(name + label_text(labels), 0.0, 0.0, rank, name))
    return lines


class Nodes:
    """What every node endpoint serves at a time: each rank's series as of its uptime."""

    def __init__(self, exposition: str, nodes: int, ranks_per_node: int, restart_after: float):
        self.started = time.time() - 60  # every rank has trained a minute when the first scrape comes
        self.restart_at = self.started + 60 + restart_after
        self.resume_at = self.restart_at + RECOVERY_SECONDS
        self.ranks_per_node = ranks_per_node
        uptime = 60.0
        self.lines = [node_lines(exposition, node, ranks_per_node, uptime) for node in range(nodes)]

    def value(self, node: int, line: Line, now: float) -> float:
        """``line``'s value at ``now``: node 5's processes end at ``restart_at``, the node serves their last values
        until ``resume_at``, then the next ones start their own counters again and go on from the run's."""
        if node != RESTARTING_NODE or now < self.restart_at:
            return line.base + line.slope * (now - self.started)
        before = line.base + line.slope * (self.restart_at - self.started)
        if now < self.resume_at:
            return before
        since = line.slope * (now - self.resume_at)
        return before + line.on_restart + since if line.carried else line.base + since

    def render(self, node: int) -> bytes:
        now = time.time()
        out = []
        for line in self.lines[node]:
            if line.prefix.startswith("neuron_exporter_rank_last_report_timestamp_seconds"):
                value = now
            else:
                value = self.value(node, line, now)
            out.append(f"{line.prefix} {value:.6f}\n")
        return "".join(out).encode()

    def life_goodput(self, now: float) -> float:
        """The run's goodput over its life at ``now`` in this model: step less lost over all the training time."""
        step = lost = total = 0.0
        for node, lines in enumerate(self.lines):
            for line in lines:
                value = self.value(node, line, now)
                if line.name == TRAINING_TIME.name:
                    total += value
                    step += value if line.phase == "step" else 0.0
                elif line.name == TRAINING_LOST.name:
                    lost += value
        return (step - lost) / total


def serve(nodes: Nodes) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            body = nodes.render(int(self.path.rsplit("/", 1)[-1]))
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def measure(prometheus: Prometheus, seconds: float) -> dict[str, dict]:
    """Every evaluation of every rule group seen in ``seconds``: {group: {"times": [...], "rules": {rule: [...]}}}."""
    seen: dict[str, dict] = {}
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for group in prometheus.get("/api/v1/rules")["data"]["groups"]:
            entry = seen.setdefault(group["name"], {"times": {}, "rules": {}})
            if group["lastEvaluation"] not in entry["times"]:
                entry["times"][group["lastEvaluation"]] = group["evaluationTime"]
                for rule in group["rules"]:
                    entry["rules"].setdefault(rule["name"], []).append(rule["evaluationTime"])
        time.sleep(INTERVAL / 3)
    return seen


def own_metric(prometheus: Prometheus, family_name: str) -> float:
    """The sum of one of Prometheus's own families, from its /metrics."""
    with urllib.request.urlopen(f"{prometheus.url}/metrics", timeout=30) as response:
        text = response.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        if family.name == family_name
        for sample in family.samples
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--ranks-per-node", type=int, default=128)
    parser.add_argument("--minutes", type=float, default=36)
    parser.add_argument("--measure-minutes", type=float, default=6)
    parser.add_argument("--restart-minute", type=float, default=10)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as work:
        directory = Path(work)
        exposition = template_exposition(directory)
        nodes = Nodes(exposition, args.nodes, args.ranks_per_node, args.restart_minute * 60)
        per_rank = sum(1 for line in nodes.lines[0] if line.rank is not None) // args.ranks_per_node
        server = serve(nodes)
        shutil.copytree(RULES, directory / "rules", ignore=shutil.ignore_patterns("tests"))
        targets = [
            {
                "targets": [f"127.0.0.1:{server.server_address[1]}"],
                "labels": {"instance": f"trn{node}:19478", "__metrics_path__": f"/node/{node}"},
            }
            for node in range(args.nodes)
        ]
        config = {
            "global": {"scrape_interval": f"{INTERVAL:g}s", "evaluation_interval": f"{INTERVAL:g}s"},
            "rule_files": [str(path) for path in sorted((directory / "rules").glob("*.yml"))],
            "scrape_configs": [{"job_name": "neuron-exporter", "static_configs": targets}],
        }
        ranks = args.nodes * args.ranks_per_node
        print(f"{ranks} ranks on {args.nodes} nodes, {per_rank} series a rank (a real rank's exposition)")
        with running_prometheus(config, directory) as prometheus:
            start = time.monotonic()
            settle = (args.minutes - args.measure_minutes) * 60
            while time.monotonic() - start < settle:
                time.sleep(min(300, settle - (time.monotonic() - start)))
                head = prometheus.get("/api/v1/status/tsdb")["data"]["headStats"]["numSeries"]
                print(f"  {(time.monotonic() - start) / 60:4.1f} min: {head} series in the head", flush=True)
            seen = measure(prometheus, args.measure_minutes * 60)
            print(f"rule groups, every {INTERVAL:g} s, over the last {args.measure_minutes:g} min:")
            for name, entry in seen.items():
                times = sorted(entry["times"].values())
                p90 = times[int(0.9 * (len(times) - 1))]
                print(
                    f"  {name:<36} {len(times):3d} evaluations: median {statistics.median(times) * 1000:7.1f} ms, "
                    f"p90 {p90 * 1000:7.1f} ms, max {times[-1] * 1000:7.1f} ms "
                    f"({times[-1] / INTERVAL:.1%} of the interval)"
                )
            slowest = sorted(
                ((statistics.median(t), rule) for entry in seen.values() for rule, t in entry["rules"].items()),
                reverse=True,
            )[:6]
            print("slowest rules (median): " + ", ".join(f"{rule} {t * 1000:.1f} ms" for t, rule in slowest))
            straggler = {
                rule: times
                for name, entry in seen.items()
                if "straggler" in name
                for rule, times in entry["rules"].items()
            }
            print(
                "the straggler's rules (median / max): "
                + ", ".join(
                    f"{rule} {statistics.median(t) * 1000:.1f} / {max(t) * 1000:.1f} ms"
                    for rule, t in straggler.items()
                )
            )
            print(
                f"iterations missed: {own_metric(prometheus, 'prometheus_rule_group_iterations_missed'):g}; "
                f"Prometheus resident: {own_metric(prometheus, 'process_resident_memory_bytes') / 2**30:.1f} GiB"
            )
            alerts = [a for a in prometheus.alerts() if a["labels"]["alertname"] == "TrainingStraggler"]
            for alert in alerts:
                where = f"rank {alert['labels']['rank']} ({alert['labels']['instance']})"
                print(f"TrainingStraggler {alert['state']}: {where}, {alert['labels']['phase']}")
            if not alerts:
                print("TrainingStraggler: none")
            others = sorted({a["labels"]["alertname"] for a in prometheus.alerts()} - {"TrainingStraggler"})
            print(f"other alerts: {', '.join(others) or 'none'}")
            recorded, model = prometheus.scalar("run:training_goodput:ratio_life"), nodes.life_goodput(time.time())
            life = f"recorded {recorded:.4f}" if recorded is not None else "not recorded"
            print(f"goodput over the run's life: {life}, the model's {model:.4f}")
            run_row_queries(prometheus)
        server.shutdown()


def run_row_queries(prometheus: Prometheus) -> None:
    """Each query of the Training overview's Run health row over the last hour, as Grafana sends it: how long it
    takes at this scale, and what it finds."""
    board = json.loads((ROOT / "dashboards" / "training-overview.json").read_text())
    variables = {**dashboard_variables("neuron-exporter"), "$__rate_interval": "1m", "$__range": "1h"}
    row, end = "", time.time()
    print("the Run health row's queries over the last hour:")
    for panel in board["panels"]:
        row = panel["title"] if panel["type"] == "row" else row
        if row != "Run health" or panel["type"] == "row":
            continue
        for target in panel["targets"]:
            expr = substitute_variables(target["expr"], variables)
            began = time.monotonic()
            if target.get("instant"):
                result = prometheus.query(expr)
            else:  # a stat: a range query, at Grafana's step for about 1,000 pixels
                result = prometheus.query_range(expr, end - 3600, end, step="15s")
            took = time.monotonic() - began
            found = result["data"]["result"] if result["status"] == "success" else result.get("error")
            if isinstance(found, list):
                last = [float(r["value"][1] if "value" in r else r["values"][-1][1]) for r in found]
                found = f"{len(last)} series" + (f", largest {max(last):.4g}" if last else "")
            print(f"  {panel['title']} {target['refId']}: {took * 1000:.0f} ms, {found}")


if __name__ == "__main__":
    main()
