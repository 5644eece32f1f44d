"""The Grafana dashboards: committed JSON equals a fresh build, every panel says what it shows and in which
unit, every query uses only metric names the exporter exports and follows the cluster, namespace, job, run,
instance and rank variables, and the configuration's selector and thresholds reach the panels."""

from __future__ import annotations

import json
import re
import subprocess

import pytest
import yaml

pytest.importorskip("grafana_foundation_sdk", reason="the dashboards extra (Python 3.11 or later)")
from neuron_exporter.mixin import build, dashboards, rules
from tests.support.contract import CONTRACT_METRICS, DEVICE_METRICS, metric_names
from tests.support.paths import DASHBOARDS, ROOT
from tests.support.prometheus import dashboard_variables, substitute_variables


def load(name: str) -> dict:
    return json.loads((DASHBOARDS / name).read_text())


def data_panels(board: dict) -> list[dict]:
    return [p for p in board["panels"] if p["type"] != "row"]


def all_exprs(board: dict) -> list[tuple[str, str]]:
    return [(panel["title"], target["expr"]) for panel in data_panels(board) for target in panel.get("targets", [])]


DASHBOARD_FILES = sorted(dashboards.DASHBOARDS)


def test_metric_name_extraction_finds_names_and_ignores_functions_and_labels():
    expr = (
        'histogram_quantile(0.9, sum by (le, rank) (rate(xla_step_duration_seconds_bucket{rank=~"$rank"}'
        "[$__rate_interval]))) / on (rank) group_left (state) neuron_exporter_rank_state == 1"
        " or vector(0) and xla_steps_tota"
    )
    assert metric_names(expr) == {"xla_step_duration_seconds_bucket", "neuron_exporter_rank_state", "xla_steps_tota"}
    assert not metric_names(expr) <= CONTRACT_METRICS  # a misspelt name is caught


def test_committed_json_is_what_the_code_builds():
    fresh = build.files()
    assert sorted(path.name for path in DASHBOARDS.glob("*.json")) == DASHBOARD_FILES
    for name in DASHBOARD_FILES:
        committed = (DASHBOARDS / name).read_text()
        assert committed == fresh[f"dashboards/{name}"], (
            f"dashboards/{name} is stale: run `make dashboards` and commit the result"
        )


@pytest.mark.parametrize("name", DASHBOARD_FILES)
def test_every_panel_has_a_description_and_every_data_panel_a_unit(name):
    board = load(name)
    for panel in data_panels(board):
        assert panel.get("description", "").strip(), f"{name}: panel {panel['title']!r} has no description"
        if panel["type"] == "text":
            assert panel["options"]["content"].strip(), f"{name}: text panel {panel['title']!r} is empty"
            continue
        assert panel.get("targets"), f"{name}: panel {panel['title']!r} has no query"
        assert panel["fieldConfig"]["defaults"].get("unit"), f"{name}: panel {panel['title']!r} has no unit"


@pytest.mark.parametrize("name", DASHBOARD_FILES)
def test_every_query_uses_only_contract_metric_names(name):
    for title, expr in all_exprs(load(name)):
        unknown = metric_names(expr) - CONTRACT_METRICS - DEVICE_METRICS
        assert not unknown, f"{name}: panel {title!r} queries unknown metrics {sorted(unknown)}: {expr}"


SCOPE = ('cluster=~"$cluster"', 'namespace=~"$namespace"', 'job=~"$job"', 'instance=~"$instance"')
PER_RANK = ('run_id=~"$run_id"', 'rank=~"$rank"')


def selectors(expr: str):
    """(metric, matchers) of every selector of an expression."""
    for metric in metric_names(expr):
        for match in re.finditer(rf"(?<![\w.]){metric}(?![\w:])(\{{[^}}]*\}})?", expr):
            yield metric, match.group(1) or ""


@pytest.mark.parametrize("name", DASHBOARD_FILES)
def test_every_selector_follows_the_selector_and_the_variables(name):
    from neuron_exporter.mixin.config import DEFAULTS

    for title, expr in all_exprs(load(name)):
        assert metric_names(expr), f"{name}: panel {title!r} selects no metric"
        for metric, matchers in selectors(expr):
            if metric in DEVICE_METRICS:  # their namespace and instance are their monitor's: their own job
                assert matchers.startswith('{cluster=~"$cluster", job=~"$device_job"'), (name, title, metric)
                continue
            assert matchers.startswith("{" + DEFAULTS.selector + ","), (
                f"{name}: panel {title!r}: {metric} ignores the configured selector"
            )
            for matcher in SCOPE:
                assert matcher in matchers, f"{name}: panel {title!r}: {metric} ignores {matcher}"
            if metric.startswith(("xla_", "neuron_exporter_rank_")):
                for matcher in PER_RANK:
                    assert matcher in matchers, f"{name}: panel {title!r}: {metric} ignores {matcher}"


def test_the_selector_reaches_every_query_and_variable():
    from neuron_exporter.mixin.config import config_from

    config = config_from({"selector": 'job="training", container="trainer"', "device_selector": 'team="ml"'})
    for name in DASHBOARD_FILES:
        board = json.loads(dashboards.dashboard_json(name, config))
        for title, expr in all_exprs(board):
            for metric, matchers in selectors(expr):
                selector = 'team="ml"' if metric in DEVICE_METRICS else 'job="training", container="trainer"'
                assert matchers.startswith("{" + selector + ", "), (name, title, metric)
            for by_name in re.findall(r'\{__name__=~"[^"]*", ([^}]*)\}', expr):  # Observer's, by a pattern
                assert by_name.startswith('team="ml", '), (name, title, by_name)
        for variable in board["templating"]["list"]:
            if variable["type"] == "query":
                selector = 'team="ml"' if variable["name"] == "device_job" else 'job="training", container="trainer"'
                assert selector in variable["query"], (name, variable["name"])
    board = json.loads(dashboards.dashboard_json("training-overview.json", config_from({"selector": ""})))
    variables = {v["name"]: v["query"] for v in board["templating"]["list"] if v["type"] == "query"}
    assert variables["cluster"] == "label_values(neuron_exporter_build_info{}, cluster)"
    assert all("{, " not in expr for _, expr in all_exprs(board))


@pytest.mark.parametrize("name", DASHBOARD_FILES)
def test_dashboard_follows_grafana_schema_basics(name):
    board = load(name)
    assert re.fullmatch(r"[a-zA-Z0-9_-]{1,40}", board["uid"])
    assert board["title"] and isinstance(board["schemaVersion"], int) and board["schemaVersion"] >= 39
    assert "neuron-exporter" in board["tags"]
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids)), f"{name}: duplicate panel ids"
    occupied = set()
    for panel in board["panels"]:
        grid = panel["gridPos"]
        assert all(isinstance(grid[k], int) for k in "xywh") and grid["w"] > 0 and grid["h"] > 0
        assert grid["x"] + grid["w"] <= 24, f"{name}: panel {panel['title']!r} is wider than the grid"
        cells = {
            (x, y) for x in range(grid["x"], grid["x"] + grid["w"]) for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not cells & occupied, f"{name}: panel {panel['title']!r} overlaps another"
        occupied |= cells
    variable_ds = {"type": "prometheus", "uid": "${datasource}"}
    for panel in data_panels(board):
        if panel["type"] == "text":
            continue
        assert panel["datasource"] == variable_ds, f"{name}: panel {panel['title']!r} has a fixed datasource"
        refs = [target["refId"] for target in panel["targets"]]
        assert len(refs) == len(set(refs))
        for target in panel["targets"]:
            assert target["datasource"] == variable_ds
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert {"datasource", "cluster", "namespace", "job", "run_id", "instance", "rank"} <= set(variables)
    assert list(variables)[:7] == ["datasource", "cluster", "namespace", "job", "run_id", "instance", "rank"]
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for variable in variables.values():
        if variable["type"] == "query":
            assert variable["datasource"] == variable_ds
            assert not re.search(rf"\${variable['name']}\b", variable["query"]), (
                f"{name}: variable {variable['name']} depends on itself"
            )
            selector = re.fullmatch(r"label_values\((.+),\s*\w+\)", variable["query"]).group(1)
            unknown = metric_names(selector) - CONTRACT_METRICS
            assert not unknown, f"{name}: variable {variable['name']} queries {unknown}"


def test_fragmentation_dashboard_has_one_row_per_problem_each_opening_with_an_explanation():
    board = load("fragmentation-recompiles.json")
    panels = board["panels"]
    rows = [i for i, p in enumerate(panels) if p["type"] == "row"]
    assert [panels[i]["title"] for i in rows] == [
        "CPU-fallback operators",
        "Graph cuts: .item(), print and host reads",
        "Recompilations",
    ]
    for i in rows:
        assert panels[i + 1]["type"] == "text", f"row {panels[i]['title']!r} does not open with a text panel"
        content = panels[i + 1]["options"]["content"]
        assert "**What it means.**" in content and "**What to do.**" in content
    assert "op" in {v["name"] for v in board["templating"]["list"]}, "no drill-down by operator"
    fallback_queries = [e for _, e in all_exprs(board) if "xla_cpu_fallback_ops_total" in e]
    assert fallback_queries and all('op=~"$op"' in e for e in fallback_queries)


def test_training_overview_has_the_promised_panels():
    titles = {panel["title"] for panel in data_panels(load("training-overview.json"))}
    assert {
        "Steps per second by rank",
        "Step time percentiles",
        "Compile vs execute share of step time",
        "Graphs per step by rank",
        "Compilations per minute",
        "Host reads per step by rank",
        "Top CPU-fallback operators",
        "Collector success",
        "Collection errors",
        "Rank state",
        "Graph cuts per step",
        "Ranks by run",
        "Steps per second by run",
        "Graph cuts per training step by run",
        "Step markers per training step by run",
        "Spool problems",
    } <= titles
    table = next(p for p in data_panels(load("training-overview.json")) if p["title"] == "Top CPU-fallback operators")
    assert table["type"] == "table" and table["targets"][0]["instant"] and "topk(" in table["targets"][0]["expr"]


def test_a_torchneuron_job_has_a_dashboard_of_its_own_and_is_listed_on_every_one():
    """Steps, fallback operators (per call and seen) and where, compiles and the cache's hit ratio, host reads,
    memory, from torchneuron_ and training_ series only; the runs and ranks of every dashboard from a series every
    backend serves."""
    board = load("torchneuron.json")
    names = set().union(*(metric_names(expr) for _, expr in all_exprs(board)))
    assert {
        "training_steps_total",
        "torchneuron_cpu_fallback_op_calls_total",
        "torchneuron_cpu_fallback_ops_seen",
        "torchneuron_cpu_fallback_site_info",
        "torchneuron_compile_cache_hits_total",
        "torchneuron_compile_cache_misses_total",
        "torchneuron_compilations_total",
        "torchneuron_host_reads_total",
        "torchneuron_memory_allocated_bytes",
        "torchneuron_memory_active_peak_bytes",
    } <= names
    assert not [name for name in names if name.startswith("xla_")]
    for name in DASHBOARD_FILES:
        variables = {v["name"]: v["query"] for v in load(name)["templating"]["list"] if "query" in v}
        for variable in ("run_id", "instance", "rank"):
            assert variables[variable].startswith("label_values(training_steps_total{"), (name, variable)
    reads = next(p for p in data_panels(load("fragmentation-recompiles.json")) if p["title"] == "Host reads by site")
    assert all("torchneuron_host_reads_total" in target["expr"] for target in reads["targets"])


def test_cuts_and_markers_per_training_step_panels():
    panels = {p["title"]: p for p in data_panels(load("fragmentation-recompiles.json"))}
    cuts = panels["Graph cuts per training step by rank"]["targets"][0]["expr"]
    markers = panels["Step markers per training step by rank"]["targets"][0]["expr"]
    assert re.fullmatch(
        r"sum by \(run_id, rank\) \(rate\(xla_graph_cuts_total\{.*\}\[\$__rate_interval\]\)\) / "
        r"sum by \(run_id, rank\) \(rate\(xla_steps_total\{.*\}\[\$__rate_interval\]\)\)",
        cuts,
    )
    assert "rate(xla_step_markers_total{" in markers and "rate(xla_steps_total{" in markers
    overview = {p["title"]: p for p in data_panels(load("training-overview.json"))}
    for title in (
        "Graph cuts per training step by run",
        "Step markers per training step by run",
        "Steps per second by run",
        "Ranks by run",
    ):
        expr = overview[title]["targets"][0]["expr"]
        assert "by (job, run_id)" in expr, f"{title} does not aggregate by run"
        assert overview[title]["targets"][0]["legendFormat"] == "{{job}} {{run_id}}"


def test_per_rank_panels_name_the_run():
    for name in DASHBOARD_FILES:
        for panel in data_panels(load(name)):
            for target in panel.get("targets", []):
                if "by (rank)" in target["expr"]:
                    pytest.fail(f"{name}: panel {panel['title']!r} groups ranks of different runs together")
                if "{{rank}}" in target.get("legendFormat", ""):
                    assert "{{run_id}}" in target["legendFormat"], (name, panel["title"])


def test_readme_lists_every_panel():
    readme = (DASHBOARDS / "README.md").read_text()
    for name in DASHBOARD_FILES:
        for panel in data_panels(load(name)):
            if panel["type"] == "text":
                continue  # the README says each row of the fragmentation dashboard opens with one
            assert panel["title"] in readme, f"dashboards/README.md does not list panel {panel['title']!r}"


def test_threshold_lines_follow_the_alert_thresholds():
    from neuron_exporter.mixin.config import config_from

    changed = config_from({"graph_cuts_per_step": 2.5})
    board = json.loads(dashboards.dashboard_json("fragmentation-recompiles.json", changed))
    panel = next(p for p in board["panels"] if p["title"] == "Graph cuts per training step by rank")
    steps = panel["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert [s["value"] for s in steps] == [None, 2.5]
    assert panel["fieldConfig"]["defaults"]["custom"]["thresholdsStyle"]["mode"] == "dashed"
    overview = json.loads(dashboards.dashboard_json("training-overview.json", changed))
    stat = next(p for p in overview["panels"] if p["title"] == "Graph cuts per step")
    assert stat["fieldConfig"]["defaults"]["thresholds"]["steps"][-1] == {"color": "red", "value": 2.5}


def rows_of(board: dict) -> dict[str, list[dict]]:
    """{row title: its panels}, in layout order."""
    rows: dict[str, list[dict]] = {}
    current = None
    for panel in board["panels"]:
        if panel["type"] == "row":
            current = rows.setdefault(panel["title"], [])
        elif current is not None:
            current.append(panel)
    return rows


def site_table_columns(panel: dict) -> tuple[list[str], list[str]]:
    """(label columns, value columns) of a merged site table, by their headers."""
    transformations = {t["id"]: t["options"] for t in panel["transformations"]}
    renamed = transformations["organize"]["renameByName"]
    names = transformations["filterFieldsByName"]["include"]["names"]
    return (
        [renamed[n] for n in names if not n.startswith("Value")],
        [renamed[n] for n in names if n.startswith("Value")],
    )


WHERE_TABLES = {
    # row: {table: (label columns, value columns)}
    "CPU-fallback operators": {"Fallback operators": (["Run", "Operator"], ["Calls per step", "Ranks"])},
    "Graph cuts: .item(), print and host reads": {
        "Graph cuts by site": (["Run", "Cause", "Site"], ["Cuts per step", "Ranks"]),
        "Host reads by site": (["Run", "Cause", "Site"], ["Reads per step", "Ranks"]),
    },
    "Recompilations": {
        "Recompilations by site": (["Run", "Site"], ["Recompilations in range", "Per step", "Ranks"]),
        "New graphs by site": (["Run", "Site"], ["Per rank", "In range", "Ranks"]),
    },
}


def test_every_problem_row_says_where_it_happens():
    """Each row of the fragmentation dashboard has a table of where its problem happens: by site (the source line,
    and the cause of a cut or host read) or by operator, per run, with the number of ranks."""
    rows = rows_of(load("fragmentation-recompiles.json"))
    for row, tables in WHERE_TABLES.items():
        panels = {panel["title"]: panel for panel in rows[row]}
        for title, columns in tables.items():
            panel = panels[title]
            assert panel["type"] == "table" and panel["transformations"][0]["id"] == "merge", title
            assert site_table_columns(panel) == columns, title
            exprs = [target["expr"] for target in panel["targets"]]
            assert all(target["instant"] and target["format"] == "table" for target in panel["targets"])
            grouping = {"Site": "location", "Cause": "cause", "Operator": "op"}
            by = ", ".join(["run_id"] + [grouping[c] for c in columns[0][1:]])
            assert all(f"by ({by})" in expr for expr in exprs), (title, exprs)
            assert exprs[-1].startswith(f"count by ({by}) (sum by ({by.replace('run_id', 'run_id, rank')})"), title
            assert panel["options"]["sortBy"] == [{"displayName": columns[1][0], "desc": True}]
    per_minute = {p["title"]: p for p in rows["Recompilations"]}["Recompilations per minute by site"]
    assert "by (run_id, location)" in per_minute["targets"][0]["expr"]
    assert per_minute["targets"][0]["legendFormat"] == "{{location}} {{run_id}}"


def test_site_tables_count_cuts_and_recompilations_per_training_step_of_the_run():
    panels = {p["title"]: p for p in data_panels(load("fragmentation-recompiles.json"))}
    cuts = panels["Graph cuts by site"]["targets"][0]["expr"]
    assert re.fullmatch(
        r"sum by \(run_id, cause, location\) \(increase\(xla_graph_cuts_total\{.*\}\[\$__range\]\)\)"
        r" / on \(run_id\) group_left sum by \(run_id\) \(increase\(xla_steps_total\{.*\}"
        r"\[\$__range\]\) > 0\) > 0",
        cuts,
    )
    recompilations = panels["Recompilations by site"]["targets"][0]["expr"]
    assert recompilations.startswith("sum by (run_id, location) (increase(xla_recompilations_total{")
    new_graphs = panels["New graphs by site"]["targets"]
    assert all("xla_new_graphs_total{" in t["expr"] and "xla_recompilations_total" not in t["expr"] for t in new_graphs)
    # the rank counts and per-step columns keep their own units
    for title, unit in (("Graph cuts by site", "suffix:cuts/step"), ("Recompilations by site", "short")):
        panel = panels[title]
        assert panel["fieldConfig"]["defaults"]["unit"] == unit
        overrides = {o["matcher"]["options"]: o["properties"] for o in panel["fieldConfig"].get("overrides", [])}
        assert all(props[0]["id"] == "unit" and props[0]["value"] for props in overrides.values())


def test_training_overview_opens_with_goodput_by_run_phase_and_rank():
    panels = {
        panel["title"]: panel for panel in rows_of(load("training-overview.json"))["Goodput: where the time goes"]
    }
    assert list(panels) == ["Goodput by run", "Badput by phase", "Goodput by rank"]
    # Goodput as the recording rules take it: the steps' time less the steps done again after a restart.
    goodput = panels["Goodput by run"]["targets"][0]["expr"]
    assert 'phase="step"' in goodput and "rate(training_lost_seconds_total{" in goodput
    assert panels["Badput by phase"]["fieldConfig"]["defaults"]["custom"]["stacking"]["mode"] == "normal"
    assert [t["legendFormat"] for t in panels["Badput by phase"]["targets"]] == ["{{phase}}", "lost work"]
    # One row per rank, the one that loses the most first, with every badput phase and the lost work beside it.
    assert site_table_columns(panels["Goodput by rank"]) == (
        ["Run", "Instance", "Rank"],
        ["Badput", "Data", "Compile", "Host sync", "Checkpoint", "Startup", "Other", "Recovery", "Lost work"],
    )
    assert all("training_time_seconds_total{" in t["expr"] for t in panels["Goodput by rank"]["targets"])


def test_training_overview_has_a_compact_where_row():
    rows = rows_of(load("training-overview.json"))
    assert list(rows)[:4] == ["Summary", "Goodput: where the time goes", "Runs", "Where: top sites"]
    panels = {panel["title"]: panel for panel in rows["Where: top sites"]}
    assert set(panels) == {"Top graph-cut sites", "Top recompilation sites"}
    assert site_table_columns(panels["Top graph-cut sites"]) == (["Run", "Cause", "Site"], ["Cuts per step", "Ranks"])
    assert site_table_columns(panels["Top recompilation sites"]) == (
        ["Run", "Site"],
        ["Recompilations in range", "Ranks"],
    )
    for panel in panels.values():
        transformations = [t["id"] for t in panel["transformations"]]
        assert transformations[-2:] == ["sortBy", "limit"] and panel["transformations"][-1]["options"] == {
            "limitField": 5
        }


def test_the_run_row_shows_goodput_over_the_life_what_restarts_cost_and_the_stragglers():
    panels = {panel["title"]: panel for panel in rows_of(load("training-overview.json"))["Run health"]}
    assert list(panels) == [
        "Goodput over the run's life",
        "Restarts by run",
        "Ranks that restarted",
        "Ranks that hold the run back",
    ]
    # Over the run's whole life: the counters' values (a rank carries them across its restarts), no window.
    life = panels["Goodput over the run's life"]
    (expr,) = [target["expr"] for target in life["targets"]]
    assert life["type"] == "stat" and "[" not in expr and "rate(" not in expr and "increase(" not in expr
    assert life["targets"][0]["instant"]  # one value, at the end of the time range: a range of it costs seconds
    assert "training_lost_seconds_total{" in expr and 'phase="step"' in expr
    assert "max by (job, run_id, rank)" in expr and "max by (job, run_id, rank, phase)" in expr  # a rank once
    assert life["targets"][0]["legendFormat"] == "{{job}} {{run_id}}"
    assert site_table_columns(panels["Restarts by run"]) == (
        ["Run"],
        ["Time lost", "Restarts", "Ranks restarted", "Recovery", "Lost work"],
    )
    assert site_table_columns(panels["Ranks that restarted"]) == (
        ["Run", "Instance", "Rank"],
        ["Time lost", "Restarts", "Recovery", "Lost work"],
    )
    for title in ("Restarts by run", "Ranks that restarted"):
        exprs = [target["expr"] for target in panels[title]["targets"]]
        assert all("[$__range]" in expr for expr in exprs), title
        assert 'phase="recovery"' in exprs[0] and "training_lost_seconds_total{" in exprs[0], title
        assert any("training_restarts_total{" in expr for expr in exprs), title
        assert panels[title]["fieldConfig"]["defaults"]["unit"] == "s"
    # A rank appears once its restarts cost time; the ten that lost the most.
    ranks = panels["Ranks that restarted"]
    assert all(target["expr"].endswith(" > 0") for target in ranks["targets"])
    assert ranks["transformations"][-1]["options"] == {"limitField": 10}


def test_the_run_row_counts_a_restart_as_the_rules_do(tmp_path):
    """The run row's queries, run by promtool on the restart of deploy/prometheus/rules/tests/goodput-recording.yml
    (run r1: rank 1's process ends at 30m, the next one goes on from it at 35m with 300 s of recovery and 288 s of
    lost work; r2 balanced; r3 without the restart series; r4 is r1 with the next process on another instance) over
    a time range of 1h ending at 60m: the life goodput is the recorded one, each rank counted once, and the
    restart's cost is counted once, for its rank and for its run."""
    rules_dir = ROOT / build.RULES_DIR
    recording = yaml.safe_load((rules_dir / "tests" / "goodput-recording.yml").read_text())
    (scenario,) = [t for t in recording["tests"] if t["name"].startswith("a rank that restarts")]
    panels = {panel["title"]: panel for panel in rows_of(load("training-overview.json"))["Run health"]}
    variables = {**dashboard_variables("neuron-exporter"), "$__range": "1h"}

    def run(r: str, **extra: str) -> str:
        return "{" + ", ".join(f'{k}="{v}"' for k, v in {"job": "neuron-exporter", "run_id": r, **extra}.items()) + "}"

    rank_1 = {"instance": "trn0:19478", "rank": "1"}
    expected = {
        ("Goodput over the run's life", 0): [(run("r1"), 720), (run("r2"), 900), (run("r3"), 600), (run("r4"), 720)],
        ("Restarts by run", 0): [(run("r1"), 588), (run("r2"), 0)],  # time lost: recovery and lost work
        ("Restarts by run", 1): [(run("r1"), 1), (run("r2"), 0)],
        ("Restarts by run", 2): [(run("r1"), 1)],  # ranks restarted
        ("Restarts by run", 3): [(run("r1"), 300), (run("r2"), 0)],
        ("Restarts by run", 4): [(run("r1"), 288), (run("r2"), 0)],
        ("Ranks that restarted", 0): [(run("r1", **rank_1), 588)],
        ("Ranks that restarted", 1): [(run("r1", **rank_1), 1)],
        ("Ranks that restarted", 2): [(run("r1", **rank_1), 300)],
        ("Ranks that restarted", 3): [(run("r1", **rank_1), 288)],
    }
    checks = []
    for (title, ref), samples in expected.items():
        life = title.startswith("Goodput")
        runs = {"$run_id": ".*" if life else "r1|r2|r3"}  # r4's next process is a new series: no increase there
        expr = substitute_variables(panels[title]["targets"][ref]["expr"], {**variables, **runs})
        scale = 1000 if life else 1
        checks.append(
            {
                "expr": f"round({scale} * ({expr}))",
                "eval_time": "60m",
                "exp_samples": [{"labels": labels, "value": value} for labels, value in samples],
            }
        )
    recorded = "round(1000 * sum by (job, run_id) (run:training_goodput:ratio_life))"
    checks.append({"expr": recorded, "eval_time": "60m", "exp_samples": checks[0]["exp_samples"]})
    document = {
        "rule_files": [str(rules_dir / rules.RECORDING_FILE)],
        "evaluation_interval": "15s",
        "tests": [{"interval": "15s", "input_series": scenario["input_series"], "promql_expr_test": checks}],
    }
    (tmp_path / "run-row.yml").write_text(yaml.safe_dump(document, width=200))
    result = subprocess.run(
        ["promtool", "test", "rules", str(tmp_path / "run-row.yml")], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-2000:]


def test_the_throughput_row_shows_each_runs_work_flops_and_mfu_and_each_ranks():
    panels = {panel["title"]: panel for panel in rows_of(load("training-overview.json"))["Throughput and step time"]}
    assert list(panels) == [
        "Tokens per second by run",
        "Samples per second by run",
        "FLOP/s by run",
        "MFU by run",
        "Throughput by rank",
        "Steps per second by rank",
        "Step time percentiles",
    ]
    for title, counter in (
        ("Tokens per second by run", "training_tokens_total"),
        ("Samples per second by run", "training_samples_total"),
        ("FLOP/s by run", "training_flops_total"),
    ):
        target = panels[title]["targets"][0]
        assert (
            target["expr"].startswith(f"sum by (job, run_id) (rate({counter}{{")
            and "{{run_id}}" in target["legendFormat"]
        )
    assert "training_peak_flops{" in panels["FLOP/s by run"]["targets"][1]["expr"]
    # MFU above 1 is a peak that is too low: the panels say so in words, not as 563%.
    mfu = panels["MFU by run"]
    assert mfu["type"] == "stat" and mfu["fieldConfig"]["defaults"]["unit"] == "percentunit"
    (mapping,) = mfu["fieldConfig"]["defaults"]["mappings"]
    assert mapping["type"] == "range" and mapping["options"]["from"] == 1 and mapping["options"]["to"] > 1e100
    assert mapping["options"]["result"]["text"] == "peak too low: set peak_flops"
    table = panels["Throughput by rank"]
    assert site_table_columns(table) == (
        ["Run", "Instance", "Rank"],
        ["Tokens/s", "Samples/s", "FLOP/s", "Peak", "MFU"],
    )
    overrides = {o["matcher"]["options"]: o["properties"] for o in table["fieldConfig"]["overrides"]}
    assert {p["id"]: p["value"] for p in overrides["MFU"]} == {"unit": "percentunit", "mappings": [mapping]}
    assert all("[$__range]" in target["expr"] for i, target in enumerate(table["targets"]) if i != 3)


def test_the_throughput_row_counts_mfu_and_the_peak_as_the_rules_do(tmp_path):
    """The run panels' MFU and peak, run by promtool with a 5m rate window on the runs of
    deploy/prometheus/rules/tests/throughput-recording.yml (m1: two ranks at 40%; m2: a rank without a peak; m3: a peak
    too low; m4: no FLOPs counted; m5: a rank that ended), are the recorded ones."""
    rules_dir = ROOT / build.RULES_DIR
    recording = yaml.safe_load((rules_dir / "tests" / "throughput-recording.yml").read_text())
    (scenario,) = recording["tests"]
    panels = {panel["title"]: panel for panel in rows_of(load("training-overview.json"))["Throughput and step time"]}
    variables = {**dashboard_variables("neuron-exporter"), "$__rate_interval": "5m"}

    def run(r: str) -> str:
        return f'{{job="neuron-exporter", run_id="{r}"}}'

    checks = []
    for panel, ref, record, scale, values in (
        ("MFU by run", 0, "run:training_mfu:ratio5m", "1000", {"m1": 400, "m3": 5630, "m5": 400}),  # per mille
        (
            "FLOP/s by run",
            1,
            "run:training_peak_flops:sum",
            "1e-12",
            {"m1": 200, "m2": 100, "m3": 1, "m4": 100, "m5": 100},
        ),
    ):
        samples = [{"labels": run(r), "value": value} for r, value in values.items()]
        expr = substitute_variables(panels[panel]["targets"][ref]["expr"], variables)
        checks.append({"expr": f"round({scale} * ({expr}))", "eval_time": "10m", "exp_samples": samples})
        recorded = f"round({scale} * sum by (job, run_id) ({record}))"
        checks.append({"expr": recorded, "eval_time": "10m", "exp_samples": samples})
    document = {
        "rule_files": [str(rules_dir / rules.RECORDING_FILE)],
        "evaluation_interval": "15s",
        "tests": [{"interval": "15s", "input_series": scenario["input_series"], "promql_expr_test": checks}],
    }
    (tmp_path / "throughput-row.yml").write_text(yaml.safe_dump(document, width=200))
    result = subprocess.run(
        ["promtool", "test", "rules", str(tmp_path / "throughput-row.yml")], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-2000:]
