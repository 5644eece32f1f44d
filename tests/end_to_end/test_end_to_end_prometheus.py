"""A real Prometheus scrapes two real torch_xla training runs: one with a CPU-fallback operator and batch sizes that
keep changing (a recompilation now and then), and one shaped like a Hugging Face Trainer run (a graph cut in every
step's forward pass, two step markers per training step, a logging .item() every 5 steps, its batches from a
DataLoader and a peak set with the peak_flops option, so that the throughput and MFU panels and rules have data
there). Every dashboard query and every rule goes through Prometheus' HTTP API; the fallback alert fires once for the
run naming the operator and the worst rank, the fragmentation alert fires on both runs naming the top site (source
line and cause), the recompilation alert (at a lower threshold) names the line that ran the recompiled graphs, and
the dashboards' site tables name the lines of the training scripts."""

from __future__ import annotations

import dataclasses
import json
import re
import select
import subprocess
import sys
import time

import pytest

pytest.importorskip("grafana_foundation_sdk", reason="the dashboards extra (Python 3.11 or later)")
from neuron_exporter.mixin import build, dashboards, rules
from neuron_exporter.mixin.config import DEFAULTS, Config
from tests.support.paths import DASHBOARDS, SCRIPTS
from tests.support.processes import wait_until, xla_env
from tests.support.prometheus import (
    Prometheus,
    dashboard_variables,
    finite_values,
    running_prometheus,
    substitute_variables,
)

pytestmark = [pytest.mark.training, pytest.mark.prometheus]

JOB = "neuron-exporter"  # fallback_and_shapes.py
TRAINER_JOB = "neuron-exporter-trainer"  # trainer_shaped.py
VARIABLES = dashboard_variables(JOB)  # rate windows of ten 1s scrapes: several samples each
BOTH_JOBS = {"$job": f"{JOB}|{TRAINER_JOB}"}  # the panels are run over both runs: each shows a different problem
# The fallback run recompiles two graphs every 150 steps (about 0.013 per step): below the default storm
# threshold, above this one, so that the recompilation alert fires on real site-labelled series.
RECOMPILATIONS_PER_STEP = 0.005
# Which alerts fire on which run. The fallback run cuts its steps twice (lgamma forward, digamma backward) and
# reads the device on the host for them, and recompiles now and then. The Trainer-shaped run cuts once per step
# plus a logging read every 5 steps (1.2 cuts and host reads per training step); its two markers per step are not
# cuts, and its new graphs (the first logging step) are not recompilations.
FIRING = {
    JOB: {"XlaCpuFallbackOp", "XlaGraphFragmentation", "XlaFrequentHostReads", "XlaRecompilationStorm"},
    TRAINER_JOB: {"XlaGraphFragmentation", "XlaFrequentHostReads"},
}


def short_for(config: Config) -> Config:
    """The same rules with every `for` at 0s, so alerts fire at their first evaluation, and the recompilation
    threshold under the fallback run's rate."""
    return dataclasses.replace(
        config,
        recompilations_per_step=RECOMPILATIONS_PER_STEP,
        **{f.name: "0s" for f in dataclasses.fields(config) if f.name.endswith("_for")},
    )


def site(script: str, name: str) -> str:
    """``script:line`` of the line of a test script marked ``# site: name``."""
    lines = (SCRIPTS / script).read_text().splitlines()
    (number,) = [n for n, line in enumerate(lines, start=1) if f"# site: {name}" in line]
    return f"{script}:{number}"


def is_site(location: str, expected: str) -> bool:
    """A `location` label names ``expected`` (a path relative to the working directory or to sys.path)."""
    return location == expected or location.endswith("/" + expected)


def start_training(script: str, tmp, name: str) -> tuple[subprocess.Popen, dict]:
    process = subprocess.Popen(
        [sys.executable, str(SCRIPTS / script), str(tmp / "stop"), str(tmp / f"spool-{name}")],
        env=xla_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    ready, _, _ = select.select([process.stdout], [], [], 300)
    line = process.stdout.readline() if ready else ""
    assert line, f"{script} did not start: {process.stderr.read() if process.poll() is not None else ''}"
    return process, json.loads(line)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Two training runs scraped every second, as two jobs, by a Prometheus that evaluates the rules every
    second."""
    tmp = tmp_path_factory.mktemp("e2e")
    trainings = []
    try:
        exporters = {}
        for job, script in ((JOB, "fallback_and_shapes.py"), (TRAINER_JOB, "trainer_shaped.py")):
            process, exporters[job] = start_training(script, tmp, job)
            trainings.append(process)

        rules_dir = tmp / "rules"
        rules_dir.mkdir()
        for name, content in rules.rule_files(short_for(DEFAULTS)).items():
            (rules_dir / name).write_text(build.rules_yaml(content))
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(rules_dir / name) for name in (rules.RECORDING_FILE, rules.ALERTS_FILE)],
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": [f"127.0.0.1:{exporter['port']}"]}]}
                for job, exporter in exporters.items()
            ],
        }
        with running_prometheus(config, tmp) as api:
            api.instances = {job: f"127.0.0.1:{exporter['port']}" for job, exporter in exporters.items()}
            api.start = time.time()
            # Enough scrapes for every rate window, and the recording rules evaluated on them.
            for job in exporters:
                wait_until(
                    lambda job=job: (api.scalar(f'count_over_time(xla_steps_total{{job="{job}"}}[1m])') or 0) >= 15,
                    timeout=120,
                    interval=0.5,
                    what=f"15 scrapes of {job}",
                )
            wait_until(
                lambda: len(api.query("rank:xla_graph_cuts_per_step:ratio5m")["data"]["result"]) == 2,
                timeout=30,
                interval=0.5,
                what="the recording rules",
            )
            yield api
    finally:
        (tmp / "stop").touch()
        codes = []
        for training in trainings:
            try:
                codes.append((training.wait(timeout=120), training))
            except subprocess.TimeoutExpired:
                training.kill()
                codes.append((training.wait(), training))
        for code, training in codes:
            assert code == 0, training.stderr.read()[-4000:]


def firing(api: Prometheus, alertname: str, job: str = JOB) -> list[dict]:
    return [
        a
        for a in api.alerts()
        if a["labels"]["alertname"] == alertname and a["labels"].get("job") == job and a["state"] == "firing"
    ]


def without_run_id(labels: dict) -> dict:
    """The labels, checking that ``run_id`` (once the ranks carry it) is one non-empty value."""
    labels = dict(labels)
    assert labels.pop("run_id", "run") != ""
    return labels


def test_fallback_alert_fires_once_per_operator_naming_the_run_and_worst_rank(run):
    alerts = wait_until(
        lambda: firing(run, "XlaCpuFallbackOp"), timeout=60, interval=0.5, what="XlaCpuFallbackOp to fire"
    )
    by_op = {alert["labels"]["op"]: alert for alert in alerts}
    assert "aten::lgamma" in by_op, f"firing for {sorted(by_op)}"
    lgamma = by_op["aten::lgamma"]
    assert without_run_id(lgamma["labels"]) == {
        "alertname": "XlaCpuFallbackOp",
        "severity": "warning",
        "job": JOB,
        "op": "aten::lgamma",
    }
    run_name = f"job {JOB}" + (f", run {lgamma['labels']['run_id']}" if "run_id" in lgamma["labels"] else "")
    assert lgamma["annotations"]["summary"] == f"Operator aten::lgamma runs on the CPU in {run_name}"
    description = lgamma["annotations"]["description"]
    assert description.startswith(
        f"aten::lgamma has no XLA lowering: it ran on the CPU in the last 10m in {run_name}. "
        f"Ranks affected: 1; most calls: rank 0 (local rank 0) of {run.instances[JOB]} ("
    ), description
    assert lgamma["annotations"]["runbook_url"].endswith("runbook.md#xlacpufallbackop")
    # lgamma's backward pass, digamma, has no lowering either; the Trainer-shaped run has no fallback.
    assert set(by_op) == {"aten::lgamma", "aten::digamma"}
    assert not firing(run, "XlaCpuFallbackOp", TRAINER_JOB)


TOP_SITE = re.compile(
    r" Top site: (\S+?)(?: \((\w+)\))?, ([0-9.]+) (cuts|recompilations) per training step over the "
    r"run's ranks\. "
)


def test_fragmentation_fires_on_a_trainer_shaped_run(run):
    """One cut per training step (an `if` on a device tensor in the forward pass) and a logging .item() every 5
    steps: about 1.2 cuts per training step, at or above the 0.5 threshold. Its two step markers per training
    step are not counted as cuts. The description names the `if` as the top site, with its cause."""
    (alert,) = wait_until(
        lambda: firing(run, "XlaGraphFragmentation", TRAINER_JOB),
        timeout=60,
        interval=0.5,
        what="XlaGraphFragmentation to fire on the Trainer-shaped run",
    )
    assert without_run_id(alert["labels"]) == {
        "alertname": "XlaGraphFragmentation",
        "severity": "warning",
        "job": TRAINER_JOB,
    }
    description = alert["annotations"]["description"]
    worst = re.search(
        r"Ranks affected: 1; worst: rank 0 \(local rank 0\) of (\S+) with ([0-9.]+) cuts per step\.", description
    )
    assert worst, description
    assert worst.group(1) == run.instances[TRAINER_JOB] and 1.0 <= float(worst.group(2)) <= 1.4, description
    top = TOP_SITE.search(description)
    assert top, description
    location, cause, per_step, what = top.groups()
    assert is_site(location, site("trainer_shaped.py", "check")) and cause == "bool", description
    assert 0.9 <= float(per_step) <= 1.1 and what == "cuts", description

    def per_step(record: str) -> float:
        return run.scalar(f'{record}{{job="{TRAINER_JOB}"}}')

    assert 1.0 <= per_step("rank:xla_graph_cuts_per_step:ratio5m") <= 1.4
    assert 1.9 <= per_step("rank:xla_step_markers_per_step:ratio5m") <= 2.1
    assert 3.0 <= per_step("rank:xla_graphs_per_step:avg5m") <= 3.4
    assert 0.9 <= per_step("rank:xla_fragmented_steps:ratio5m") <= 1.0


def test_fragmentation_of_the_fallback_run_names_the_cpu_fallback(run):
    """The fallback run's two cuts per step come from the operators that run on the CPU, inside C++: no Python
    line, so the site is `unknown` with cause `cpu_fallback`."""
    (alert,) = wait_until(
        lambda: firing(run, "XlaGraphFragmentation"),
        timeout=60,
        interval=0.5,
        what="XlaGraphFragmentation to fire on the fallback run",
    )
    description = alert["annotations"]["description"]
    top = TOP_SITE.search(description)
    assert top, description
    location, cause, per_step, _ = top.groups()
    assert (location, cause) == ("unknown", "cpu_fallback") and 1.8 <= float(per_step) <= 2.2, description


def test_recompilation_alert_names_the_line_that_ran_the_recompiled_graphs(run):
    """The recompilation alert sums xla_recompilations_total over its sites; its description names the top one:
    the step marker of the fallback run, or `unknown` for the graph the CPU fallback cut (both recompile once per
    new batch size). The Trainer-shaped run compiles new graphs (its first logging step) but never recompiles."""
    (alert,) = wait_until(
        lambda: firing(run, "XlaRecompilationStorm"),
        timeout=90,
        interval=0.5,
        what="XlaRecompilationStorm to fire on the fallback run",
    )
    assert without_run_id(alert["labels"]) == {"alertname": "XlaRecompilationStorm", "severity": "warning", "job": JOB}
    description = alert["annotations"]["description"]
    assert f"More than {RECOMPILATIONS_PER_STEP:g} recompilations per training step after warm-up" in description
    top = TOP_SITE.search(description)
    assert top, description
    location, cause, per_step, what = top.groups()
    assert what == "recompilations" and cause is None and 0 < float(per_step) < 0.05, description
    recompiled = run.query(f'xla_recompilations_total{{job="{JOB}"}}')["data"]["result"]
    locations = {series["metric"]["location"] for series in recompiled}
    assert any(is_site(loc, site("fallback_and_shapes.py", "sync")) for loc in locations), locations
    assert location in locations, (location, locations)
    assert run.query(f'xla_recompilations_total{{job="{TRAINER_JOB}"}}')["data"]["result"] == []
    assert run.scalar(f'sum(xla_new_graphs_total{{job="{TRAINER_JOB}"}})') >= 2
    assert not firing(run, "XlaRecompilationStorm", TRAINER_JOB)


def test_every_rule_evaluates_and_only_the_expected_alerts_fire(run):
    for job, names in FIRING.items():
        for name in names:
            wait_until(
                lambda name=name, job=job: firing(run, name, job),
                timeout=90,
                interval=0.5,
                what=f"{name} to fire on {job}",
            )

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
            seen[name] = rule.get("state", "recorded") if rule["type"] == "alerting" else len(parsed["data"]["result"])
            for alert in rule.get("alerts", []):  # the descriptions' rank lookups ran without a template error
                for text in alert["annotations"].values():
                    assert "error expanding template" not in text and "<no value>" not in text, f"{name}: {text}"
    print("\nrules (alert state, or series recorded):", *(f"  {n}: {v}" for n, v in seen.items()), sep="\n")
    alerts = {(a["labels"].get("job"), a["labels"]["alertname"]) for a in run.alerts() if a["state"] == "firing"}
    assert alerts == {(job, name) for job, names in FIRING.items() for name in names}
    recorded = {name: count for name, count in seen.items() if name in rules.RECORDING_RULES}
    assert all(count >= 1 for count in recorded.values()), f"recording rules without data: {recorded}"


def substitute(expr: str, **overrides: str) -> str:
    return substitute_variables(expr, {**VARIABLES, **overrides})


# TorchNeuron's dashboard has its data from a TorchNeuron job (test_torchneuron_prometheus.py); here its queries
# must parse and run.
NOT_FROM_XLA = {"torchneuron.json"}
# Panels empty here by design, each with data where it is tested: the Devices rows read neuron-monitor's series
# (test_device_join_prometheus.py), and these runs are balanced, with no rank that holds one back (the straggler
# rules' promtool tests and benchmarks/straggler_runs.py) and no restart (tests/assets/test_dashboards.py runs the
# restart tables on the restart of the goodput recording rules' promtool tests).
EMPTY_HERE_ROWS = ("Devices",)
EMPTY_HERE_PANELS = {"Ranks that hold the run back", "Ranks that restarted"}


@pytest.mark.parametrize("dashboard", sorted(dashboards.DASHBOARDS))
def test_every_dashboard_query_parses_and_every_panel_has_data(run, dashboard):
    board = json.loads((DASHBOARDS / dashboard).read_text())
    end = time.time()
    report, empty = {}, []
    row = ""
    for panel in board["panels"]:
        row = panel["title"] if panel.get("type") == "row" else row
        targets = panel.get("targets", [])
        if not targets:
            continue
        counts = []
        for target in targets:
            expr = substitute(target["expr"], **BOTH_JOBS)
            result = run.query(expr) if target.get("instant") else run.query_range(expr, run.start, end)
            assert result["status"] == "success", f"{panel['title']}: {expr}: {result.get('error')}"
            counts.append(finite_values(result))
        report[panel["title"]] = counts
        if not any(counts) and not row.startswith(EMPTY_HERE_ROWS) and panel["title"] not in EMPTY_HERE_PANELS:
            empty.append(panel["title"])
    print(
        f"\n{dashboard}: finite values per query of each panel:",
        *(f"  {title}: {counts}" for title, counts in report.items()),
        sep="\n",
    )
    if dashboard not in NOT_FROM_XLA:
        assert not empty, f"{dashboard}: panels without data: {empty}"


def test_dashboard_variables_list_the_run(run):
    def label_values(metric_selector: str, label: str) -> list[str]:
        return run.get(f"/api/v1/label/{label}/values", **{"match[]": substitute(metric_selector)})["data"]

    variables = {
        v["name"]: v["query"]
        for name in dashboards.DASHBOARDS
        for v in json.loads((DASHBOARDS / name).read_text())["templating"]["list"]
        if v["type"] == "query"
    }
    found = {}
    for name, query in variables.items():
        selector, label = query.removeprefix("label_values(").removesuffix(")").rsplit(",", 1)
        found[name] = label_values(selector, label.strip())
    assert sorted(found["job"]) == sorted(FIRING)
    assert found["rank"] == ["0"]
    assert set(found["op"]) == {"aten::lgamma", "aten::digamma"}
    assert found["instance"] == [run.instances[JOB]]
    assert found["cluster"] == found["namespace"] == []  # labels Prometheus adds in Kubernetes, not here
    assert len(found["run_id"]) == 1  # the job's one run


def test_the_runs_row_shows_each_of_two_concurrent_runs(run):
    """Both trainings ran at once; each is its own run_id, and every per-run panel shows one series per run."""
    board = json.loads((DASHBOARDS / "training-overview.json").read_text())
    titles = (
        "Ranks by run",
        "Steps per second by run",
        "Graph cuts per training step by run",
        "Step markers per training step by run",
    )
    panels = [panel for panel in board["panels"] if panel.get("title") in titles]
    assert sorted(panel["title"] for panel in panels) == sorted(titles)
    runs_by_job = {}
    for panel in panels:
        expr = substitute(panel["targets"][0]["expr"], **BOTH_JOBS)
        series = run.query(expr)["data"]["result"]
        runs = {(s["metric"].get("job"), s["metric"]["run_id"]) for s in series}
        assert len(runs) == 2 and {job for job, _ in runs} == {JOB, TRAINER_JOB}, (panel["title"], series)
        runs_by_job.setdefault(panel["title"], runs)
    assert len({frozenset(runs) for runs in runs_by_job.values()}) == 1  # the same two runs in every panel
    cuts = {
        s["metric"]["job"]: float(s["value"][1])
        for s in run.query(
            substitute(next(p for p in panels if p["title"] == titles[2])["targets"][0]["expr"], **BOTH_JOBS)
        )["data"]["result"]
    }
    assert cuts[TRAINER_JOB] > 1.0 and cuts[JOB] > 1.0  # 1.2 per step; 2 per step (lgamma, digamma)


def test_the_metric_contract_is_what_the_exporter_serves(run):
    from tests.support.contract import CONTRACT_METRICS, PROMETHEUS_OWN

    result = run.query(f'count by (__name__) ({{job=~"{JOB}|{TRAINER_JOB}"}})')["data"]["result"]
    scraped = {series["metric"]["__name__"] for series in result}
    not_exported = (
        {name for name in scraped if name.startswith(("scrape_", "ALERTS"))}
        | PROMETHEUS_OWN
        | set(rules.RECORDING_RULES)
    )
    # No function is compiled with torch.compile in these runs, so these families have no series here; the
    # torch.compile tests scrape them from real compiled runs.
    not_compiled = {
        "torch_compile_compilations_total",
        "torch_compile_recompilations_total",
        "torch_compile_graph_breaks_total",
        "torch_compile_recompile_limit_hits_total",
    }
    # TorchNeuron's families are served only where torch_neuronx runs (tests/training/test_torchneuron.py).
    not_neuron = {name for name in CONTRACT_METRICS if "torchneuron_" in name}
    # A process's NeuronCores only where NEURON_RT_VISIBLE_CORES names them (test_device_join_prometheus.py).
    not_neuron |= {"neuron_exporter_neuroncore_info"}
    assert scraped - not_exported == CONTRACT_METRICS - PROMETHEUS_OWN - not_compiled - not_neuron


def table_rows(run: Prometheus, dashboard: str, title: str, job: str) -> list[dict]:
    """The rows of a site table as Grafana merges them: {label: value} plus each query's value by refId."""
    board = json.loads((DASHBOARDS / dashboard).read_text())
    (panel,) = [p for p in board["panels"] if p["title"] == title]
    rows: dict[tuple, dict] = {}
    for target in panel["targets"]:
        result = run.query(substitute(target["expr"], **{"$job": job}))
        assert result["status"] == "success", (title, result.get("error"))
        for series in result["data"]["result"]:
            key = tuple(sorted(series["metric"].items()))
            rows.setdefault(key, dict(series["metric"]))[target["refId"]] = float(series["value"][1])
    return list(rows.values())


def test_site_tables_name_the_lines_of_the_training_scripts(run):
    """The "where" tables of the dashboards, run as Grafana runs them: the Trainer-shaped run's cuts and host reads
    are at its `if` (bool, once per step) and its logging .item() (every 5th step), each on its one rank; the
    fallback run recompiles at its step marker, and its operators run on the CPU once per step."""
    wait_until(
        lambda: firing(run, "XlaRecompilationStorm"),
        timeout=90,
        interval=0.5,
        what="a recompilation in the scraped range",
    )
    check, logging = site("trainer_shaped.py", "check"), site("trainer_shaped.py", "logging")
    for title, dashboard in (
        ("Graph cuts by site", "fragmentation-recompiles.json"),
        ("Host reads by site", "fragmentation-recompiles.json"),
        ("Top graph-cut sites", "training-overview.json"),
    ):
        rows = table_rows(run, dashboard, title, TRAINER_JOB)
        by_site = {
            (
                row["cause"],
                check
                if is_site(row["location"], check)
                else logging
                if is_site(row["location"], logging)
                else row["location"],
            ): row
            for row in rows
        }
        assert set(by_site) == {("bool", check), ("item", logging)}, (title, rows)
        assert 0.9 <= by_site["bool", check]["A"] <= 1.1 and 0.1 <= by_site["item", logging]["A"] <= 0.3, rows
        assert all(row["B"] == 1 for row in rows), rows  # one rank
    for title, dashboard in (
        ("Recompilations by site", "fragmentation-recompiles.json"),
        ("Top recompilation sites", "training-overview.json"),
    ):
        rows = table_rows(run, dashboard, title, JOB)
        assert any(
            is_site(row["location"], site("fallback_and_shapes.py", "sync")) and row["A"] >= 1 for row in rows
        ), (title, rows)
    assert table_rows(run, "fragmentation-recompiles.json", "Recompilations by site", TRAINER_JOB) == []
    new_graphs = table_rows(run, "fragmentation-recompiles.json", "New graphs by site", TRAINER_JOB)
    assert any(is_site(row["location"], logging) for row in new_graphs), new_graphs
    operators = {row["op"]: row for row in table_rows(run, "fragmentation-recompiles.json", "Fallback operators", JOB)}
    assert set(operators) == {"aten::lgamma", "aten::digamma"}, operators
    assert all(0.9 <= row["A"] <= 1.1 and row["B"] == 1 for row in operators.values()), operators
    called = {
        (row["op"], row["pass"]): row["location"]
        for row in table_rows(run, "fragmentation-recompiles.json", "Where fallback operators are called", JOB)
    }
    assert set(called) == {("aten::lgamma", "forward"), ("aten::digamma", "backward")}, called
    assert is_site(called["aten::lgamma", "forward"], site("fallback_and_shapes.py", "lgamma")), called
    assert is_site(called["aten::digamma", "backward"], site("fallback_and_shapes.py", "backward")), called
