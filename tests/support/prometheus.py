"""A real Prometheus server for a test: started on a free port with a given configuration, queried over its HTTP
API, stopped when the test is done."""

from __future__ import annotations

import contextlib
import json
import math
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import yaml

from tests.support.daemon import free_port
from tests.support.processes import wait_until


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

    def by_rank(self, expr: str) -> dict[str | None, float] | None:
        """{rank label: value} of an instant query; None while it has no result."""
        result = self.query(expr)["data"]["result"]
        return {r["metric"].get("rank"): float(r["value"][1]) for r in result} or None

    def alerts(self) -> list[dict]:
        return self.get("/api/v1/alerts")["data"]["alerts"]


@contextlib.contextmanager
def running_prometheus(config: dict, directory: Path) -> Iterator[Prometheus]:
    """Prometheus with ``config`` (written to ``directory``/prometheus.yml, its data and log beside it), ready."""
    (directory / "prometheus.yml").write_text(yaml.safe_dump(config))
    log = directory / "prometheus.log"
    port = free_port()
    with log.open("w") as err:
        process = subprocess.Popen(
            [
                "prometheus",
                f"--config.file={directory / 'prometheus.yml'}",
                f"--storage.tsdb.path={directory / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    api = Prometheus(f"http://127.0.0.1:{port}")

    def ready():
        assert process.poll() is None, log.read_text()
        try:
            with urllib.request.urlopen(f"{api.url}/-/ready", timeout=10) as response:
                return response.status == 200
        except OSError:
            return False

    try:
        wait_until(ready, timeout=60, what="Prometheus to be ready")
        yield api
    finally:
        process.terminate()
        process.wait(timeout=30)


def dashboard_variables(job: str) -> dict[str, str]:
    """Values for the variables of the shipped dashboards: every series of ``job``, rate windows of ten 1 s scrapes."""
    return {
        "$__rate_interval": "10s",
        "$__range": "1h",
        "$cluster": ".*",
        "$namespace": ".*",
        "$job": job,
        "$run_id": ".*",
        "$instance": ".*",
        "$rank": ".*",
        "$op": ".*",
        "$device_job": ".*",
    }


def substitute_variables(expr: str, variables: dict[str, str]) -> str:
    """A dashboard query with Grafana's variables (``$job``, ``$__rate_interval``...) replaced, longest first."""
    for variable in sorted(variables, key=len, reverse=True):
        expr = expr.replace(variable, variables[variable])
    return expr


def finite_values(result: dict) -> int:
    """How many finite values a query's result holds (a range query's over all its points)."""
    data = result["data"]["result"]
    if result["data"]["resultType"] == "matrix":
        values = [v for series in data for _, v in series["values"]]
    else:
        values = [series["value"][1] for series in data]
    return sum(1 for v in values if math.isfinite(float(v)))
