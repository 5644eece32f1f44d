"""A real Prometheus scrapes a real torch_xla training run (one CPU-fallback operator, one shape change); every
dashboard query and every rule goes through Prometheus' HTTP API, and the fallback alert fires naming the
operator."""

from __future__ import annotations

import dataclasses
import json
import math
import select
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import pytest
import yaml

from conftest import SCRIPTS, scrape, wait_until, xla_env

from dashboards import build, rules
from dashboards.config import DEFAULTS, Thresholds

JOB = "neuron-exporter"
RATE_INTERVAL = "10s"  # ten 1s scrapes: every rate() window of the dashboards holds several samples
VARIABLES = {"$__rate_interval": RATE_INTERVAL, "$__range": "1h", "$job": JOB, "$instance": ".*", "$rank": ".*",
             "$op": ".*"}
FIRING_IN_THIS_RUN = {"XlaCpuFallbackOp", "XlaGraphFragmentation", "XlaFrequentHostReads"}

def short_for(thresholds: Thresholds) -> Thresholds:
    """The same rules with every `for` at 0s, so alerts fire at their first evaluation."""
    return dataclasses.replace(thresholds, **{f.name: "0s" for f in dataclasses.fields(thresholds)
                                              if f.name.endswith("_for")})


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Prometheus:
    def __init__(self, url: str):
        self.url = url

    def get(self, path: str, **params) -> dict:
        query = urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=30) as response:
                return json.load(response)
        except urllib.error.HTTPError as error:  # 400/422 carry the PromQL error as JSON
            return json.load(error)

    def query(self, expr: str) -> dict:
        return self.get("/api/v1/query", query=expr)

    def query_range(self, expr: str, start: float, end: float, step: str = "2s") -> dict:
        return self.get("/api/v1/query_range", query=expr, start=start, end=end, step=step)

    def scalar(self, expr: str) -> float | None:
        result = self.query(expr)["data"]["result"]
        return float(result[0]["value"][1]) if result else None

    def alerts(self) -> list[dict]:
        return self.get("/api/v1/alerts")["data"]["alerts"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A training run scraped every second by a Prometheus that evaluates the rules every second."""
    tmp = tmp_path_factory.mktemp("e2e")
    stop_file = tmp / "stop"
    training = subprocess.Popen([sys.executable, str(SCRIPTS / "fallback_and_shapes.py"), str(stop_file),
                                 str(tmp / "spool")], env=xla_env(), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    prometheus = None
    try:
        ready, _, _ = select.select([training.stdout], [], [], 300)
        line = training.stdout.readline() if ready else ""
        assert line, f"the training script did not start: {training.stderr.read() if training.poll() else ''}"
        exporter = json.loads(line)

        rules_dir = tmp / "rules"
        rules_dir.mkdir()
        for name, content in rules.rule_files(short_for(DEFAULTS)).items():
            (rules_dir / name).write_text(build.rules_yaml(content))
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(rules_dir / name) for name in (rules.RECORDING_FILE, rules.ALERTS_FILE)],
            "scrape_configs": [{"job_name": JOB, "static_configs": [
                {"targets": [f"127.0.0.1:{exporter['port']}"]}]}],
        }
        (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
        port = free_port()
        prometheus = subprocess.Popen(
            ["prometheus", f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
            stdout=subprocess.DEVNULL, stderr=(tmp / "prometheus.log").open("w"))
        api = Prometheus(f"http://127.0.0.1:{port}")

        def ready_prometheus():
            assert prometheus.poll() is None, (tmp / "prometheus.log").read_text()
            try:
                return scrape(f"{api.url}/-/ready")
            except OSError:
                return None

        wait_until(ready_prometheus, timeout=60, what="Prometheus to be ready")
        api.start = time.time()
        # Enough scrapes for every rate window, and the recording rules evaluated on them.
        wait_until(lambda: (api.scalar(f'count_over_time(xla_steps_total{{job="{JOB}"}}[1m])') or 0) >= 15,
                   timeout=120, interval=0.5, what="15 scrapes of the training run")
        wait_until(lambda: api.query("rank:xla_graphs_per_step:avg5m")["data"]["result"], timeout=30,
                   interval=0.5, what="the recording rules")
        yield api
    finally:
        stop_file.touch()
        try:
            code = training.wait(timeout=120)
        except subprocess.TimeoutExpired:
            training.kill()
            code = training.wait()
        if prometheus is not None:
            prometheus.terminate()
            prometheus.wait(timeout=30)
        assert code == 0, training.stderr.read()[-4000:]


def fallback_alerts(api: Prometheus) -> list[dict]:
    return [a for a in api.alerts() if a["labels"]["alertname"] == "XlaCpuFallbackOp" and a["state"] == "firing"]


def test_fallback_alert_fires_naming_the_operator_and_rank(run):
    firing = wait_until(lambda: fallback_alerts(run), timeout=60, interval=0.5, what="XlaCpuFallbackOp to fire")
    by_op = {alert["labels"]["op"]: alert for alert in firing}
    assert "aten::lgamma" in by_op, f"firing for {sorted(by_op)}"
    lgamma = by_op["aten::lgamma"]
    assert lgamma["labels"] | {"instance": "any"} == {
        "alertname": "XlaCpuFallbackOp", "severity": "warning", "job": JOB, "instance": "any",
        "rank": "0", "local_rank": "0", "op": "aten::lgamma"}
    assert lgamma["annotations"]["summary"] == "Operator aten::lgamma runs on the CPU on rank 0"
    assert lgamma["annotations"]["description"].startswith("aten::lgamma has no XLA lowering: it ran on the CPU ")
    assert lgamma["annotations"]["runbook_url"].endswith("runbook.md#xlacpufallbackop")
    # lgamma's backward pass, digamma, has no lowering either.
    assert set(by_op) == {"aten::lgamma", "aten::digamma"}


def test_every_rule_evaluates_and_only_the_expected_alerts_fire(run):
    wait_until(lambda: fallback_alerts(run), timeout=60, interval=0.5, what="XlaCpuFallbackOp to fire")

    def rule_groups():
        groups = run.get("/api/v1/rules")["data"]["groups"]
        evaluated = [r for g in groups for r in g["rules"] if not r.get("lastEvaluation", "0001").startswith("0001")]
        return groups if len(evaluated) == len(rules.RECORDING_RULES) + len(rules.alert_rules()) else None

    groups = wait_until(rule_groups, timeout=30, interval=0.5, what="every rule to be evaluated")
    seen = {}
    for group in groups:
        for rule in group["rules"]:
            name = rule["name"]
            assert rule["health"] == "ok", f"{name}: {rule.get('lastError')}"
            parsed = run.query(rule["query"])
            assert parsed["status"] == "success", f"{name}: {parsed.get('error')}"
            seen[name] = rule.get("state", "recorded") if rule["type"] == "alerting" else len(
                parsed["data"]["result"])
    print("\nrules (alert state, or series recorded):", *(f"  {n}: {v}" for n, v in seen.items()), sep="\n")
    firing = {name for name, state in seen.items() if state == "firing"}
    assert firing == FIRING_IN_THIS_RUN
    recorded = {name: count for name, count in seen.items() if name in rules.RECORDING_RULES}
    assert all(count >= 1 for count in recorded.values()), f"recording rules without data: {recorded}"


def substitute(expr: str) -> str:
    for variable in sorted(VARIABLES, key=len, reverse=True):
        expr = expr.replace(variable, VARIABLES[variable])
    return expr


def finite_values(result: dict) -> int:
    data = result["data"]["result"]
    if result["data"]["resultType"] == "matrix":
        values = [v for series in data for _, v in series["values"]]
    else:
        values = [series["value"][1] for series in data]
    return sum(1 for v in values if math.isfinite(float(v)))


@pytest.mark.parametrize("dashboard", sorted(build.DASHBOARDS))
def test_every_dashboard_query_parses_and_every_panel_has_data(run, dashboard):
    board = json.loads((build.DASHBOARDS_DIR / dashboard).read_text())
    end = time.time()
    report, empty = {}, []
    for panel in board["panels"]:
        targets = panel.get("targets", [])
        if not targets:
            continue
        counts = []
        for target in targets:
            expr = substitute(target["expr"])
            result = run.query(expr) if target.get("instant") else run.query_range(expr, run.start, end)
            assert result["status"] == "success", f"{panel['title']}: {expr}: {result.get('error')}"
            counts.append(finite_values(result))
        report[panel["title"]] = counts
        if not any(counts):
            empty.append(panel["title"])
    print(f"\n{dashboard}: finite values per query of each panel:",
          *(f"  {title}: {counts}" for title, counts in report.items()), sep="\n")
    assert not empty, f"{dashboard}: panels without data: {empty}"


def test_dashboard_variables_list_the_run(run):
    def label_values(metric_selector: str, label: str) -> list[str]:
        return run.get(f"/api/v1/label/{label}/values", **{"match[]": substitute(metric_selector)})["data"]

    variables = {v["name"]: v["query"] for name in build.DASHBOARDS
                 for v in json.loads((build.DASHBOARDS_DIR / name).read_text())["templating"]["list"]
                 if v["type"] == "query"}
    found = {}
    for name, query in variables.items():
        selector, label = query.removeprefix("label_values(").removesuffix(")").rsplit(",", 1)
        found[name] = label_values(selector, label.strip())
    assert found["job"] == [JOB]
    assert found["rank"] == ["0"]
    assert set(found["op"]) == {"aten::lgamma", "aten::digamma"}
    assert len(found["instance"]) == 1


def test_the_metric_contract_is_what_the_exporter_serves(run):
    from test_dashboards import CONTRACT_METRICS, PROMETHEUS_OWN

    result = run.query(f'count by (__name__) ({{job="{JOB}"}})')["data"]["result"]
    scraped = {series["metric"]["__name__"] for series in result}
    not_exported = {name for name in scraped if name.startswith(("scrape_", "ALERTS"))} | PROMETHEUS_OWN | set(
        rules.RECORDING_RULES)
    assert scraped - not_exported == CONTRACT_METRICS - PROMETHEUS_OWN
