"""A real training process with its NeuronCores (``NEURON_RT_VISIBLE_CORES``) and an instance id, and stand-ins for
neuron-monitor and Neuron Observer that serve that process beside others, all scraped by a real Prometheus: every
query of the device rows, as the shipped dashboards hold it, answers with the rank's run and rank, with its own
process's values, never another process's; and with no device exporter selected, every device query is empty, not
an error."""

from __future__ import annotations

import json
import select
import subprocess
import sys
import time

import pytest

pytest.importorskip("grafana_foundation_sdk", reason="the dashboards extra (Python 3.11 or later)")
from neuron_exporter.mixin import device_layer
from tests.support.device_layer import Instance, Runtime, neuron_monitor, observer
from tests.support.paths import DASHBOARDS, SCRIPTS
from tests.support.processes import wait_until, xla_env
from tests.support.prometheus import dashboard_variables, running_prometheus, substitute_variables

pytestmark = [pytest.mark.training, pytest.mark.prometheus]

RUN, RANK, NODE = "device-join-run", "3", "node-a"
HERE, ELSEWHERE = "i-0a1b2c3d4e5f60718", "i-0fedcba9876543210"
GIB = 2**30
DEVICE_DASHBOARDS = ("training-overview.json", "torchneuron.json")


def device_queries() -> list[tuple[str, str, str, str]]:
    """(dashboard, panel, legend or refId, expr) of every query of the device rows."""
    queries = []
    for name in DEVICE_DASHBOARDS:
        in_row = False
        for panel in json.loads((DASHBOARDS / name).read_text())["panels"]:
            if panel["type"] == "row":
                in_row = panel["title"].startswith("Devices")
            elif in_row:
                queries += [
                    (name, panel["title"], t.get("legendFormat") or t["refId"], t["expr"]) for t in panel["targets"]
                ]
    return queries


def start_job(tmp_path) -> tuple[subprocess.Popen, dict]:
    env = xla_env(
        NEURON_RT_VISIBLE_CORES="2-3",
        NEURON_EXPORTER_INSTANCE_ID=HERE,
        NEURON_EXPORTER_RUN_ID=RUN,
        RANK=RANK,
        NODE_NAME=NODE,
    )
    process = subprocess.Popen(
        [sys.executable, str(SCRIPTS / "endpoint_job.py"), "0", str(tmp_path / "spool")],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    ready, _, _ = select.select([process.stdout], [], [], 300)
    assert ready, "endpoint_job.py did not start"
    return process, json.loads(process.stdout.readline())


def test_every_device_panel_shows_the_rank_and_never_another_process(tmp_path):
    queries = device_queries()
    assert len(queries) >= 9 and {dashboard for dashboard, *_ in queries} == set(DEVICE_DASHBOARDS)
    process, job = start_job(tmp_path)
    tag = str(job["pid"])  # no NEURON_PROCESS_TAG: neuron-monitor tags the process with its id
    ours = Runtime(tag, (2, 3), 0.25, 1 * GIB, 2**20, {"generic": 1})
    neighbour = Runtime("other-job.rank0", (0, 1), 0.75, 3 * GIB, 3 * 2**20, {"numerical": 5})
    # Another machine with a process of the same id on the same cores: only the instance tells them apart.
    twin = Runtime(tag, (2, 3), 0.5, 5 * GIB, 5 * 2**20, {"hardware": 7})
    here = neuron_monitor(Instance(HERE, {"mem_ecc_uncorrected": 1, "mem_ecc_corrected": 3}), [ours, neighbour])
    elsewhere = neuron_monitor(Instance(ELSEWHERE, {"mem_ecc_uncorrected": 100}), [twin])
    try:
        with here, elsewhere, observer(2) as node_a, observer(50) as node_b:
            config = {
                "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
                "scrape_configs": [
                    {"job_name": "neuron-exporter", "static_configs": [{"targets": [f"127.0.0.1:{job['port']}"]}]},
                    {"job_name": "neuron-monitor", "static_configs": [{"targets": [here.target, elsewhere.target]}]},
                    {
                        "job_name": "neuron-observer",
                        "static_configs": [
                            {"targets": [node_a.target], "labels": {"node": NODE}},
                            {"targets": [node_b.target], "labels": {"node": "node-b"}},
                        ],
                    },
                ],
            }
            with running_prometheus(config, tmp_path) as api:
                variables = dashboard_variables("neuron-exporter")

                def answers() -> dict | None:
                    """Every device query's result at one instant, once each has a series."""
                    now = time.time()
                    results = {}
                    for dashboard, title, legend, expr in queries:
                        result = api.get("/api/v1/query", query=substitute_variables(expr, variables), time=now)
                        assert result["status"] == "success", (dashboard, title, result.get("error"))
                        if not result["data"]["result"]:
                            return None
                        results[(dashboard, title, legend)] = result["data"]["result"]
                    return {"time": now, "results": results}

                answered = wait_until(answers, timeout=120, interval=0.5, what="every device query to answer")
                truth = truths(api, answered["time"], tag)
                for (dashboard, title, legend), series in answered["results"].items():
                    for one in series:
                        labels = one["metric"]
                        assert (labels.get("run_id"), labels.get("rank")) == (RUN, RANK), (dashboard, title, one)
                        assert set(labels) <= {"run_id", "rank", "memory_location", "error_type"}, (title, one)
                        expected = truths_for(truth, title, legend, labels)
                        if expected is not None:
                            assert float(one["value"][1]) == pytest.approx(expected), (dashboard, title, legend, one)
                assert_the_device_job_variable_lists_the_device_jobs(api)
                assert_empty_without_a_device_exporter(api, queries, variables)
    finally:
        process.stdin.close()
        process.wait(timeout=60)
    assert process.returncode == 0, process.stderr.read()[-4000:]


def truths(api, at: float, tag: str) -> dict[str, float]:
    """Our process's values, selected from the device layer's series directly, at the instant of the panels."""

    def value(expr: str) -> float:
        (series,) = api.get("/api/v1/query", query=expr, time=at)["data"]["result"]
        return float(series["value"][1])

    ours = f'instance_id="{HERE}", runtime_tag="{tag}"'
    ecc = f'{device_layer.ECC_EVENTS}{{instance_id="{HERE}", event_type=~".*_'
    return {
        "errors": value(f"sum(rate({device_layer.EXECUTION_ERRORS}{{{ours}}}[10s])) * 60"),
        "errors in range": value(f"sum(increase({device_layer.EXECUTION_ERRORS}{{{ours}}}[1h]))"),
        "uncorrected": value(f'sum(rate({ecc}uncorrected"}}[10s])) * 60'),
        "uncorrected in range": value(f'sum(rate({ecc}uncorrected"}}[1h])) * 60'),
        "corrected": value(f'sum(rate({ecc}corrected"}}[10s])) * 60'),
        "observer": value(f'sum(rate(neuron_device_mem_ecc_uncorrected_total{{node="{NODE}"}}[10s])) * 60'),
    }


# The series of the table "Ranks and their NeuronCores", by query: the rank's cores, their utilisation, its goodput,
# its execution errors and its instance's uncorrected ECC events over the range.
TABLE = {"A": 2, "B": 0.25, "C": None, "D": "errors in range", "E": "uncorrected in range"}


def truths_for(truth: dict[str, float], title: str, legend: str, labels: dict) -> float | None:
    """What a panel's series must show where it is ours alone: a neighbour's or a twin's would add to it."""
    if title == "Ranks and their NeuronCores":
        expected = TABLE[legend]
        return truth[expected] if isinstance(expected, str) else expected
    if legend.startswith("NeuronCores"):
        return 0.25
    if title == "Neuron runtime memory by rank":
        return {"host": 2**20, "neuron_device": 1 * GIB}[labels["memory_location"]]
    if title == "Execution errors per minute by rank":
        assert labels["error_type"] == "generic"
        return truth["errors"]
    if title.startswith("ECC events"):
        return truth["observer" if "Observer" in legend else legend.split()[0]]
    return None


def assert_the_device_job_variable_lists_the_device_jobs(api) -> None:
    for name in DEVICE_DASHBOARDS:
        board = json.loads((DASHBOARDS / name).read_text())
        (query,) = [v["query"] for v in board["templating"]["list"] if v["name"] == "device_job"]
        selector = query.removeprefix("label_values(").removesuffix(", job)")
        selector = substitute_variables(selector, {"$cluster": ".*"})
        jobs = api.get("/api/v1/label/job/values", **{"match[]": selector})["data"]
        assert jobs == ["neuron-monitor", "neuron-observer"], (name, jobs)


def assert_empty_without_a_device_exporter(api, queries, variables) -> None:
    none = {**variables, "$device_job": "no-device-exporter"}
    for dashboard, title, _, expr in queries:
        if "$device_job" in expr:
            result = api.query(substitute_variables(expr, none))
            assert result["status"] == "success" and result["data"]["result"] == [], (dashboard, title, result)
