"""A real Prometheus scrapes a rank's own endpoint in OpenMetrics and a node endpoint in the text format, whole and
with ``params: name[]``, and the series arrive."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, Info

from neuron_exporter.web.http_server import MetricsServer
from tests.support.processes import wait_until
from tests.support.prometheus import running_prometheus

pytestmark = pytest.mark.prometheus

NODE_TEXT = (
    b"# HELP demo_steps_total Steps\n# TYPE demo_steps_total counter\n"
    b'demo_steps_total{rank="0"} 3.0\ndemo_steps_total{rank="1"} 4.0\n'
    b"# HELP demo_up Up\n# TYPE demo_up gauge\n"
    b'demo_up{rank="0"} 1.0\ndemo_up{rank="1"} 1.0\n'
)


def rank_registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    Counter("demo_step_time", "Time in steps", ["rank"], unit="seconds", registry=registry).labels("0").inc(3)
    Histogram("demo_step_seconds", "Step time", registry=registry).observe(0.2)
    Info("demo_build", "Build", registry=registry).info({"version": "1"})
    return registry


def scrape_config(job: str, port: int, **extra) -> dict:
    return {"job_name": job, "scrape_interval": "1s", "static_configs": [{"targets": [f"127.0.0.1:{port}"]}], **extra}


def test_prometheus_scrapes_a_rank_in_openmetrics_and_a_node_in_text(tmp_path):
    rank = MetricsServer(rank_registry(), addr="127.0.0.1", port=0).start()
    node = MetricsServer(lambda: NODE_TEXT, addr="127.0.0.1", port=0).start()
    config = {
        "global": {"scrape_interval": "1s"},
        "scrape_configs": [
            scrape_config("rank", rank.port),
            scrape_config("node", node.port),
            scrape_config("rank-selected", rank.port, params={"name[]": ["demo_step_time_seconds_total"]}),
            scrape_config("node-selected", node.port, params={"name[]": ["demo_up"]}),
        ],
    }
    try:
        with running_prometheus(config, tmp_path) as prometheus:

            def series(job: str) -> set[str] | None:
                result = prometheus.query(f'{{job="{job}", __name__!~"up|scrape_.*"}}')["data"]["result"]
                return {r["metric"]["__name__"] for r in result} or None

            rank_series = wait_until(lambda: series("rank"), timeout=60, what="the rank's series")
            assert {"demo_step_time_seconds_total", "demo_step_seconds_bucket", "demo_build_info"} <= rank_series
            assert prometheus.scalar('demo_step_time_seconds_total{job="rank", rank="0"}') == 3.0
            assert wait_until(lambda: series("node"), what="the node's series") == {"demo_steps_total", "demo_up"}
            assert wait_until(lambda: series("rank-selected"), what="a selection") == {"demo_step_time_seconds_total"}
            assert wait_until(lambda: series("node-selected"), what="a selection") == {"demo_up"}

            # The unit is metadata only OpenMetrics carries: the rank was read as OpenMetrics, the node as text.
            def metadata(job: str, metric: str) -> list[dict]:
                found = prometheus.get("/api/v1/targets/metadata", match_target=f'{{job="{job}"}}', metric=metric)
                return found["data"]

            (om,) = wait_until(lambda: metadata("rank", "demo_step_time_seconds"), what="the rank's metadata")
            assert (om["type"], om["unit"]) == ("counter", "seconds")
            (text,) = wait_until(lambda: metadata("node", "demo_steps_total"), what="the node's metadata")
            assert (text["type"], text["unit"]) == ("counter", "")
    finally:
        rank.stop()
        node.stop()
