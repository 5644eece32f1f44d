"""The Prometheus rules: committed YAML equals a fresh build, promtool accepts them, every alert is tested by
`promtool test rules` and documented in the runbook, alerts are per run and keep the configured labels, and the
configuration (selector, labels, severities, thresholds) is changed in one place."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import yaml

pytest.importorskip("grafana_foundation_sdk", reason="the dashboards extra (Python 3.11 or later)")
from neuron_exporter.mixin import build, rules
from neuron_exporter.mixin.config import DEFAULTS, RUNBOOK_URL, Config, ConfigError, config_from, load_config
from neuron_exporter.mixin.rules import promql
from tests.support.contract import CONTRACT_METRICS, metric_names
from tests.support.paths import DASHBOARDS, ROOT

RULES_DIR = ROOT / build.RULES_DIR
RULE_FILES = [RULES_DIR / rules.RECORDING_FILE, RULES_DIR / rules.ALERTS_FILE]
TEST_FILES = sorted((RULES_DIR / "tests").glob("*.yml"))
RUNBOOK = ROOT / "deploy" / "prometheus" / "runbook.md"


def rules_of(content: dict) -> list[dict]:
    """The rules of a rule file's content, group after group."""
    return [rule for group in content["groups"] for rule in group["rules"]]


def committed_alerts() -> list[dict]:
    return rules_of(yaml.safe_load(RULE_FILES[1].read_text()))


def promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["promtool", *args], capture_output=True, text=True, timeout=120)


def test_committed_rules_are_what_the_code_builds():
    fresh = build.files()
    for path in RULE_FILES:
        name = path.relative_to(ROOT).as_posix()
        assert path.read_text() == fresh[name], f"{name} is stale: run `make dashboards` and commit"


def test_promtool_check_rules_is_clean():
    result = promtool("check", "rules", *map(str, RULE_FILES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules.alert_rules())} rules found" in result.stdout
    assert f"SUCCESS: {len(rules.RECORDING_RULES)} rules found" in result.stdout


def test_alerts_are_grouped_by_topic():
    recording = yaml.safe_load(RULE_FILES[0].read_text())["groups"]
    assert [group["name"] for group in recording] == [
        "neuron-exporter.xla.recording",
        "neuron-exporter.straggler.recording",
        "neuron-exporter.throughput.recording",
    ]
    groups = {group["name"]: group["rules"] for group in yaml.safe_load(RULE_FILES[1].read_text())["groups"]}
    prefixes = {
        "neuron-exporter.xla": "Xla",
        "neuron-exporter.torch_compile": "TorchCompile",
        "neuron-exporter.torchneuron": "TorchNeuron",
        "neuron-exporter.startup": "TrainingStartup",
        "neuron-exporter.goodput": "TrainingGoodput",
        "neuron-exporter.straggler": "TrainingStraggler",
        "neuron-exporter.throughput": "Training",
        "neuron-exporter.exporter": "NeuronExporter",
    }
    assert list(groups) == list(prefixes)
    for name, prefix in prefixes.items():
        assert groups[name] and all(rule["alert"].startswith(prefix) for rule in groups[name]), name


def test_fill_replaces_placeholders_and_leaves_go_template_variables():
    text = promql.fill("{{ $value }} of {{ $labels.job }} over ${window}", window="5m")
    assert text == "{{ $value }} of {{ $labels.job }} over 5m"
    # A template that starts on a new line is written indented like the code: it loses the indentation.
    assert promql.fill("\n    count by (${run}) (\n      up\n    )\n    ", run="job") == "count by (job) (\n  up\n)"
    assert promql.fill("a ${x} and ${x}", x="%q") == "a %q and %q"  # values are not templates themselves
    assert promql.fill("${x}", x="${y}") == "${y}"


@pytest.mark.parametrize(
    "template, values, message",
    [
        ("rate(${counter}[${windwo}])", {"counter": "up", "window": "5m"}, r"\['windwo'\].*\['window'\]"),
        ("rate(${counter}[5m])", {"counter": "up", "window": "5m"}, r"without placeholders \['window'\]"),
        ("rate(${counter}[${window])", {"counter": "up", "window": "5m"}, "malformed"),
        ("rate(${ counter }[5m])", {"counter": "up"}, "malformed"),
    ],
)
def test_fill_raises_on_a_placeholder_without_a_value_or_a_value_without_a_placeholder(template, values, message):
    with pytest.raises(ValueError, match=message):
        promql.fill(template, **values)


@pytest.mark.parametrize("test_file", TEST_FILES, ids=lambda p: p.name)
def test_promtool_unit_tests_pass(test_file):
    result = promtool("test", "rules", str(test_file))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promtool_unit_tests_fail_when_an_alert_changes(tmp_path):
    """The unit tests check the exact annotations: a changed description makes them fail."""
    (tmp_path / "tests").mkdir()
    for path in RULE_FILES:
        (tmp_path / path.name).write_text(path.read_text().replace("has no XLA lowering", "lacks a lowering"))
    test_file = tmp_path / "tests" / "xla-alerts.yml"
    test_file.write_text((RULES_DIR / "tests" / "xla-alerts.yml").read_text())
    result = promtool("test", "rules", str(test_file))
    assert result.returncode != 0 and "XlaCpuFallbackOp" in result.stdout + result.stderr


def unit_test_cases() -> list[tuple[dict, dict]]:
    """(test, alert_rule_test) of every promtool unit test."""
    return [
        (test, case)
        for path in TEST_FILES
        for test in yaml.safe_load(path.read_text())["tests"]
        for case in test.get("alert_rule_test", [])
    ]


def identity(labels: dict) -> frozenset:
    """The labels that say which rank, operator, stage... a series or an alert is about."""
    return frozenset((k, v) for k, v in labels.items() if k not in ("__name__", "le", "state", "severity"))


def series_labels(series: str) -> dict:
    return dict(re.findall(r'(\w+)="([^"]*)"', series))


@pytest.mark.parametrize("alert", [rule["alert"] for rule in committed_alerts()])
def test_every_alert_has_a_firing_and_a_silent_unit_test(alert):
    cases = [(test, case) for test, case in unit_test_cases() if case["alertname"] == alert]
    firing = [(test, case) for test, case in cases if case["exp_alerts"]]
    assert firing, f"no promtool test expects {alert} to fire"
    for _, case in firing:
        for expected in case["exp_alerts"]:
            assert set(expected["exp_annotations"]) == {"summary", "description", "runbook_url"}
            assert expected["exp_labels"]["severity"]
    # Silent on a clean series: an evaluation that expects no alert, or a firing one in which some input series
    # (a clean rank, stage, collector...) gets no alert.
    silent = any(not case["exp_alerts"] for _, case in cases) or any(has_clean_series(*pair) for pair in firing)
    assert silent, f"no promtool test shows {alert} silent on a clean series"


def has_clean_series(test: dict, case: dict) -> bool:
    alerted = [identity(expected["exp_labels"]) for expected in case["exp_alerts"]]
    return any(
        not any(identity(series_labels(series["series"])) >= labels for labels in alerted)
        for series in test["input_series"]
    )


PER_RUN = {rule["alert"] for rule in committed_alerts() if rule["expr"].startswith("count by (")}


@pytest.mark.parametrize("rule", committed_alerts(), ids=lambda r: r["alert"])
def test_every_alert_has_severity_summary_description_and_runbook(rule):
    assert rule["labels"]["severity"] in ("warning", "critical", "info")
    annotations = rule["annotations"]
    assert set(annotations) == {"summary", "description", "runbook_url"}
    assert annotations["runbook_url"] == f"{RUNBOOK_URL}#{rule['alert'].lower()}"
    if rule["alert"] in PER_RUN:
        # One alert per run: the description names the run, how many ranks are affected and the worst rank.
        for label in DEFAULTS.aggregation_labels:
            assert f"$labels.{label}" in annotations["summary"] and f"$labels.{label}" in annotations["description"]
        assert "Ranks affected: {{ $value }}" in annotations["description"]
        assert 'label "rank" .' in annotations["description"] and "| query" in annotations["description"]
    if "op)" in rule["expr"]:
        assert "$labels.op" in annotations["description"] and "$labels.op" in annotations["summary"]


def test_training_and_rank_alerts_are_per_run():
    assert PER_RUN >= {
        "XlaCpuFallbackOp",
        "XlaRecompilationStorm",
        "XlaGraphFragmentation",
        "XlaFrequentHostReads",
        "XlaCompileTimeDominates",
        "XlaTrainingStalled",
        "TorchNeuronCpuFallbackOp",
        "TorchNeuronFrequentHostReads",
        "NeuronExporterRankHung",
        "NeuronExporterRankDead",
        "NeuronExporterCollectionErrors",
        "NeuronExporterCollectorFailing",
    }
    by_name = {rule["alert"]: rule for rule in committed_alerts()}
    assert by_name["XlaCpuFallbackOp"]["expr"].startswith("count by (cluster, namespace, job, run_id, op) (")
    for name in ("NeuronExporterRankHung", "NeuronExporterRankDead"):
        assert by_name[name]["for"] == "5m" and by_name[name]["labels"]["severity"] == "warning"


def aggregations(expr: str) -> list[list[str]]:
    """The label lists of every `by (...)` and `on (...)` of an expression."""
    return [[label.strip() for label in match.split(",")] for match in re.findall(r"\b(?:by|on) \(([^)]*)\)", expr)]


@pytest.mark.parametrize(
    "labels", [DEFAULTS.aggregation_labels, ("team", "job"), ("cluster", "namespace", "job", "run_id", "pod")], ids=str
)
def test_every_aggregation_keeps_the_configured_labels(labels):
    config = config_from({"aggregation_labels": list(labels)})
    for _name, content in rules.rule_files(config).items():
        for rule in rules_of(content):
            groupings = aggregations(rule["expr"])
            assert groupings or rule.get("alert") == "NeuronExporterDown", rule  # `up == 0` keeps every label
            for grouping in groupings:
                assert set(labels) <= set(grouping), f"{rule.get('alert') or rule.get('record')} drops a label"


def test_runbook_has_one_section_per_alert_and_nothing_else():
    headings = re.findall(r"^## (.+)$", RUNBOOK.read_text(), flags=re.MULTILINE)
    assert headings == [rule["alert"] for rule in committed_alerts()]
    # GitHub's anchor for "## XlaCpuFallbackOp" is "#xlacpufallbackop", which runbook_url uses.
    assert all(re.fullmatch(r"[A-Za-z]+", heading) for heading in headings)


def test_readme_lists_every_alert():
    readme = (DASHBOARDS / "README.md").read_text()
    for rule in committed_alerts():
        assert f"`{rule['alert']}`" in readme, f"dashboards/README.md does not list {rule['alert']}"


def test_rules_use_only_contract_metrics_and_their_own_recordings():
    recorded = set(rules.RECORDING_RULES)
    for path in RULE_FILES:
        for rule in rules_of(yaml.safe_load(path.read_text())):
            unknown = metric_names(rule["expr"]) - CONTRACT_METRICS - recorded
            assert not unknown, f"{path.name}: {rule.get('alert') or rule.get('record')} uses {sorted(unknown)}"


def test_recording_rules_are_used_by_the_alerts():
    alert_exprs = " ".join(rule["expr"] for rule in committed_alerts())
    used = {name for name in rules.RECORDING_RULES if name in alert_exprs}
    assert used >= {
        "rank:xla_recompilations_per_step:ratio5m",
        "rank:xla_graph_cuts_per_step:ratio5m",
        "rank:xla_device_to_host_transfers_per_step:ratio5m",
        "rank:xla_compile_time_share:ratio5m",
    }


def test_goodput_counts_lost_work_as_badput_and_over_the_life_reads_the_counters_values():
    """One goodput everywhere: the steps' time less the steps done again after a restart, over all the time. Over a
    run's life it is the counters' values (a rank carries them across its restarts): no rate, no window, each rank
    once whatever the aggregation labels. Its values are in deploy/prometheus/rules/tests/goodput-recording.yml."""
    for name in ("rank:training_goodput:ratio5m", "run:training_goodput:ratio5m"):
        assert "rate(training_lost_seconds_total{" in rules.RECORDING_RULES[name], name
    (rule,) = [rule for rule in committed_alerts() if rule["alert"] == "TrainingGoodputLow"]
    assert "rate(training_lost_seconds_total{" in rule["expr"]
    for labels in (DEFAULTS.aggregation_labels, ("cluster", "job")):
        recording = dict(rules.recording_rules(config_from({"aggregation_labels": list(labels)})))
        life = recording["run:training_goodput:ratio_life"]
        assert "rate(" not in life and "increase(" not in life and "[" not in life
        run = ", ".join(labels)
        rank = ", ".join(dict.fromkeys((*labels, "run_id", "rank")))
        assert f"sum by ({run}) (max by ({rank}) (training_lost_seconds_total{{" in life
        assert f"(sum by ({run}) (max by ({rank}, phase) (training_time_seconds_total{{" in life


def test_recompilation_alert_counts_recompilations_of_every_site_and_never_new_graphs():
    recorded = rules.RECORDING_RULES["rank:xla_recompilations_per_step:ratio5m"]
    assert "rate(xla_recompilations_total{" in recorded and "rank:xla_steps:rate5m" in recorded
    assert "xla_new_graphs_total" not in recorded and "xla_compilations_total" not in recorded
    # summed over the sites: the per-rank grouping does not keep location
    assert all("location" not in grouping for grouping in aggregations(recorded))
    (rule,) = [rule for rule in committed_alerts() if rule["alert"] == "XlaRecompilationStorm"]
    assert "rank:xla_recompilations_per_step:ratio5m > 0.1" in rule["expr"]


def test_site_recording_rules_are_per_run_and_site():
    run = ", ".join(DEFAULTS.aggregation_labels)
    cuts = rules.RECORDING_RULES["run_location:xla_graph_cuts_per_step:ratio5m"]
    recompilations = rules.RECORDING_RULES["run_location:xla_recompilations_per_step:ratio5m"]
    assert cuts.startswith(f"sum by ({run}, cause, location) (rate(xla_graph_cuts_total{{")
    assert recompilations.startswith(f"sum by ({run}, location) (rate(xla_recompilations_total{{")
    for expr in (cuts, recompilations):
        assert 'location!=""' in expr  # series without a site (an older exporter) have no site to name
        assert f"/ on ({run}) group_left\nsum by ({run}) (rank:xla_steps:rate5m > 0)" in expr


@pytest.mark.parametrize(
    "alert, record, site",
    [
        (
            "XlaGraphFragmentation",
            "run_location:xla_graph_cuts_per_step:ratio5m",
            'Top site: {{ label "location" . }}{{ with label "cause" . }} ({{ . }}){{ end }}',
        ),
        (
            "XlaRecompilationStorm",
            "run_location:xla_recompilations_per_step:ratio5m",
            'Top site: {{ label "location" . }}',
        ),
    ],
)
def test_fragmentation_and_recompilation_alerts_name_the_top_site_of_the_run(alert, record, site):
    """The description looks the site up in the alert's run (every aggregation label matched) by a template
    query on the per-run, per-site recording rule; without a site (series without location) the sentence is
    left out."""
    (rule,) = [rule for rule in committed_alerts() if rule["alert"] == alert]
    description = rule["annotations"]["description"]
    matchers = ", ".join(f"{label}=%q" for label in DEFAULTS.aggregation_labels)
    lookup = f'{{{{ with printf "topk(1, {record}{{{matchers}}})"'
    assert lookup in description
    body = description[description.index(lookup) :]
    assert site in body and body.index(site) < body.index("{{ end }}{{ end }}")


def test_fragmentation_is_graph_cuts_per_training_step():
    recorded = rules.RECORDING_RULES["rank:xla_graph_cuts_per_step:ratio5m"]
    assert "rate(xla_graph_cuts_total" in recorded and "rank:xla_steps:rate5m" in recorded
    assert "rate(xla_steps_total" in rules.RECORDING_RULES["rank:xla_steps:rate5m"]
    (rule,) = [rule for rule in committed_alerts() if rule["alert"] == "XlaGraphFragmentation"]
    assert "rank:xla_graph_cuts_per_step:ratio5m >= 0.5" in rule["expr"]


def test_a_threshold_changed_in_one_place_reaches_the_rules():
    changed = config_from({"graph_cuts_per_step": 2.5, "fallback_for": "0s", "fallback_window": "1m"})
    by_name = {rule["alert"]: rule for rule in rules.alert_rules(changed)}
    assert "rank:xla_graph_cuts_per_step:ratio5m >= 2.5" in by_name["XlaGraphFragmentation"]["expr"]
    assert "At least 2.5 graph cuts" in by_name["XlaGraphFragmentation"]["annotations"]["description"]
    assert by_name["XlaCpuFallbackOp"]["for"] == "0s"
    assert "[1m]" in by_name["XlaCpuFallbackOp"]["expr"]


def selected_metrics(expr: str) -> list[tuple[str, str]]:
    """(metric, matchers) of every metric selector in an expression that is not a recorded series."""
    return [
        (m.group(1), m.group(2) or "")
        for m in re.finditer(r"(?<![\w:])([a-z_]+)(\{[^}]*\})?(?=[\[ )\n]|$)", expr)
        if m.group(1) in CONTRACT_METRICS
    ]


def test_changing_a_severity_or_the_selector_changes_the_generated_rules(tmp_path):
    changed = config_from(
        {
            "fallback_severity": "critical",
            "rank_dead_severity": "critical",
            "selector": 'job="training", container="trainer"',
            "runbook_url": "https://wiki.example.com/neuron-exporter",
        }
    )
    default_files = {name: build.rules_yaml(content) for name, content in rules.rule_files().items()}
    changed_files = {name: build.rules_yaml(content) for name, content in rules.rule_files(changed).items()}
    assert all(default_files[name] != changed_files[name] for name in default_files)
    by_name = {rule["alert"]: rule for rule in rules.alert_rules(changed)}
    assert by_name["XlaCpuFallbackOp"]["labels"]["severity"] == "critical"
    assert by_name["NeuronExporterRankDead"]["labels"]["severity"] == "critical"
    assert by_name["NeuronExporterRankHung"]["labels"]["severity"] == "warning"
    assert (
        by_name["XlaCpuFallbackOp"]["annotations"]["runbook_url"]
        == "https://wiki.example.com/neuron-exporter#xlacpufallbackop"
    )
    # Every metric the rules select (recorded series excepted) carries the selector, in the rules and in the
    # description's rank lookups; and the defaults carry theirs.
    for config, selector in ((changed, 'job="training", container="trainer"'), (DEFAULTS, DEFAULTS.selector)):
        for content in rules.rule_files(config).values():
            for rule in rules_of(content):
                found = selected_metrics(rule["expr"])
                for lookup in re.findall(
                    r'printf "((?:[^"\\]|\\.)*)"', rule.get("annotations", {}).get("description", "")
                ):
                    found += selected_metrics(lookup.replace('\\"', '"'))
                assert found or rule["expr"].startswith("count by (") or rule.get("record")
                for metric, matchers in found:
                    assert matchers.startswith("{" + selector), (rule.get("alert") or rule.get("record"), metric)
    # Still rules promtool accepts.
    for name, text in changed_files.items():
        (tmp_path / name).write_text(text)
    result = promtool("check", "rules", *(str(tmp_path / name) for name in changed_files))
    assert result.returncode == 0, result.stdout + result.stderr


def test_an_empty_selector_selects_by_metric_name():
    by_name = {rule["alert"]: rule for rule in rules.alert_rules(config_from({"selector": ""}))}
    assert by_name["NeuronExporterDown"]["expr"] == "up == 0"
    assert "increase(xla_cpu_fallback_ops_total[10m])" in by_name["XlaCpuFallbackOp"]["expr"]


def test_configured_labels_survive_into_the_alert(tmp_path):
    """With `pod` added to the aggregation labels, a 4-rank fallback over two pods is one alert per pod naming
    it, and a custom severity reaches it: promtool runs the generated rules."""
    config = config_from(
        {"aggregation_labels": ["cluster", "namespace", "job", "run_id", "pod"], "fallback_severity": "critical"}
    )
    for name, content in rules.rule_files(config).items():
        (tmp_path / name).write_text(build.rules_yaml(content))
    series = [
        {
            "series": f'xla_cpu_fallback_ops_total{{cluster="c1", namespace="ml", job="neuron-exporter", '
            f'run_id="r1", instance="node{rank // 2}:19478", pod="train-{rank // 2}", rank="{rank}", '
            f'local_rank="{rank % 2}", op="aten::lgamma"}}',
            "values": f"0+{60 * (1 + rank % 2)}x20",
        }
        for rank in range(4)
    ]  # odd ranks call it twice as often
    run = "cluster c1, namespace ml, job neuron-exporter, run r1, pod train-{}"
    expected = [
        {
            "exp_labels": {
                "severity": "critical",
                "cluster": "c1",
                "namespace": "ml",
                "job": "neuron-exporter",
                "run_id": "r1",
                "pod": f"train-{pod}",
                "op": "aten::lgamma",
            },
            "exp_annotations": {
                "summary": f"Operator aten::lgamma runs on the CPU in {run.format(pod)}",
                "description": f"aten::lgamma has no XLA lowering: it ran on the CPU in the last 10m in "
                f"{run.format(pod)}. Ranks affected: 2; most calls: rank {2 * pod + 1} (local rank 1) "
                f"of node{pod}:19478 (1200). Every call cuts the graph and copies its tensors to the "
                "host and back. Every rank: the Fragmentation & recompiles dashboard.",
                "runbook_url": f"{RUNBOOK_URL}#xlacpufallbackop",
            },
        }
        for pod in range(2)
    ]
    test = {
        "rule_files": [rules.RECORDING_FILE, rules.ALERTS_FILE],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series,
                "alert_rule_test": [{"eval_time": "15m", "alertname": "XlaCpuFallbackOp", "exp_alerts": expected}],
            }
        ],
    }
    (tmp_path / "test.yml").write_text(yaml.safe_dump(test))
    result = promtool("test", "rules", str(tmp_path / "test.yml"))
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_generator_is_a_function_from_a_config_to_files(tmp_path):
    files = build.files({"selector": 'job="training"', "graph_cuts_per_step": 1})
    assert sorted(files) == [
        "dashboards/fragmentation-recompiles.json",
        "dashboards/torch-compile.json",
        "dashboards/torchneuron.json",
        "dashboards/training-overview.json",
        f"deploy/prometheus/rules/{rules.ALERTS_FILE}",
        f"deploy/prometheus/rules/{rules.RECORDING_FILE}",
    ]
    alerts = rules_of(yaml.safe_load(files[f"deploy/prometheus/rules/{rules.ALERTS_FILE}"]))
    assert next(r for r in alerts if r["alert"] == "NeuronExporterDown")["expr"] == 'up{job="training"} == 0'
    assert 'job=\\"training\\"' in files["dashboards/training-overview.json"]
    written = build.write(tmp_path, files)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in written) == sorted(files)
    assert all(path.read_text() == files[path.relative_to(tmp_path).as_posix()] for path in written)
    with pytest.raises(ConfigError, match="unknown configuration key 'graphs_per_step'"):
        build.files({"graphs_per_step": 2})
    with pytest.raises(ValueError, match="fallback_severity: 'page' is not one of critical, warning, info"):
        build.files({"fallback_severity": "page"})


def test_config_file_overrides_defaults(tmp_path):
    path = tmp_path / "config.yml"
    path.write_text(
        "graph_cuts_per_step: 2\nfallback_for: 30s\naggregation_labels: [cluster, job, pod]\n"
        "rank_dead_severity: critical\nselector: ''\n"
    )
    loaded = load_config(path)
    assert (loaded.graph_cuts_per_step, loaded.fallback_for, loaded.host_reads_per_step) == (2.0, "30s", 0.5)
    assert loaded.aggregation_labels == ("cluster", "job", "pod") and loaded.rank_dead_severity == "critical"
    assert loaded.selector == ""
    assert load_config(path) == config_from(loaded.as_dict())


@pytest.mark.parametrize(
    "content, message",
    [
        ("graph_cuts_per_step: 2\ngraph_cut_per_step: 3\n", ":2: unknown configuration key 'graph_cut_per_step'"),
        ("fallback_for: 5 minutes\n", ":1: fallback_for: '5 minutes' is not a Prometheus duration"),
        ("host_reads_per_step: lots\n", ":1: host_reads_per_step: 'lots' must be a number"),
        ("stall_severity: page\n", ":1: stall_severity: 'page' is not one of critical, warning, info"),
        ("aggregation_labels: job\n", ":1: aggregation_labels: 'job' must be a list of label names"),
        ("aggregation_labels: [job, rank]\n", ":1: aggregation_labels: 'rank' cannot be an aggregation label"),
        ("aggregation_labels: [job, 2x]\n", ":1: aggregation_labels: '2x' is not a Prometheus label name"),
        ("selector: '{job=\"x\"}'\n", ":1: selector: '{job=\"x\"}' is not a list of label matchers"),
        ("- 1\n", ":1: expected a mapping"),
        ("fallback_for: 5m\nfallback_for: 6m\n", ':2: duplicate key "fallback_for" (first on line 1)'),
    ],
)
def test_bad_config_file_gives_one_line_naming_the_problem(tmp_path, content, message):
    path = tmp_path / "config.yml"
    path.write_text(content)
    with pytest.raises(ConfigError) as error:
        load_config(path)
    assert message in str(error.value) and str(path) in str(error.value) and "\n" not in str(error.value)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "neuron_exporter.mixin",
            "--config",
            str(path),
            "--output",
            str(tmp_path / "out"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and message in result.stderr
    assert not (tmp_path / "out").exists(), "nothing is written when the configuration is bad"


def test_config_rejects_bad_values_in_code():
    with pytest.raises(ValueError, match="stall_window"):
        Config(stall_window="ten minutes")
    with pytest.raises(ConfigError, match="expected a mapping"):
        config_from(["selector"])
