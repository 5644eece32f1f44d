"""The metric catalogue (``neuron_exporter/catalogue.py``): every family is built from one of its entries, and a
family served that it lacks, or describes otherwise, is caught. ``tests/test_readme.py`` checks it against
``docs/metrics.md``; the dashboards' and rules' tests check that they name only its series."""

from __future__ import annotations

import ast
import re

import pytest

from neuron_exporter import catalogue, label_values
from neuron_exporter.catalogue import COUNTER, FAMILIES, SERIES, Family
from neuron_exporter.metric_family import labelled_family, single_series
from neuron_exporter.untrusted import LabelBudget
from tests.support.exposition import uncatalogued
from tests.support.paths import ROOT


def test_every_family_is_built_from_the_catalogue():
    kit = ROOT / "neuron_exporter" / "metric_family.py"
    built_elsewhere = [
        path.relative_to(ROOT).as_posix()
        for path in (ROOT / "neuron_exporter").rglob("*.py")
        if path != kit and re.search(r"\b(Counter|Gauge|Histogram)MetricFamily\(", path.read_text())
    ]
    assert built_elsewhere == []


def test_the_kit_refuses_a_family_the_catalogue_lacks():
    with pytest.raises(ValueError, match="not in the catalogue"):
        single_series(Family("xla_unlisted_total", COUNTER, "Not listed", catalogue.XLA), {"rank": "0"}, 1)


def test_a_served_family_the_catalogue_lacks_or_describes_otherwise_is_caught():
    labels = {"run_id": "r", "rank": "0", "local_rank": "0"}
    steps = single_series(catalogue.XLA_STEPS, labels, 3)
    text = (
        f"# HELP {steps.name}_total {steps.documentation}\n# TYPE {steps.name}_total counter\n"
        'xla_steps_total{run_id="r",rank="0",local_rank="0"} 3.0\n'
    )
    assert uncatalogued(text) == []
    assert uncatalogued(text.replace("xla_steps", "xla_unlisted_steps")) == [
        "xla_unlisted_steps_total: not in the catalogue"
    ]
    assert uncatalogued(text.replace('local_rank="0"', 'local_rank="0",op="x"')) != []
    assert uncatalogued(text.replace(steps.documentation, "Other words")) != []
    assert uncatalogued(text.replace(steps.documentation, "Other words"), check_help=False) == []


def test_a_budget_sends_later_values_to_other_and_their_counts_add_up():
    family = labelled_family(
        catalogue.XLA_GRAPH_CUTS,
        {"rank": "0"},
        [(("item", "a.py:1"), 2), (("item", "b.py:2"), 3), (("item", "c.py:3"), 4)],
        {"location": LabelBudget(1)},
    )
    assert [(s.labels["location"], s.value) for s in family.samples] == [("a.py:1", 2), ("other", 7)]


def test_every_entry_names_its_owner_and_its_type():
    owners = {
        *(catalogue.XLA, catalogue.STEPS, catalogue.TIME_PHASES, catalogue.THROUGHPUT, catalogue.COMPILE),
        catalogue.NEURON,
        *(catalogue.RANK, catalogue.NODE),
    }
    for family in FAMILIES.values():
        assert family.owner in owners and family.type in ("counter", "gauge", "histogram"), family.name
        assert family.name.endswith("_total") == (family.type == COUNTER), family.name
        assert family.help and not family.help.endswith("."), family.name


def test_the_dashboards_and_rules_take_the_names_of_series_from_the_catalogue():
    """Not one written out in their code (docstrings aside): renaming a family is one edit, in the catalogue."""
    written = []
    for path in sorted((ROOT / "neuron_exporter" / "mixin").rglob("*.py")):
        tree = ast.parse(path.read_text())
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)) and ast.get_docstring(node) is not None
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                named = set(re.findall(r"(?<![\w:])([a-z][a-z0-9_]*[a-z0-9])(?![\w:])", node.value)) & SERIES
                written += [f"{path.relative_to(ROOT)}:{node.lineno}: {name}" for name in sorted(named)]
    assert written == []


def test_every_label_value_the_rules_dashboards_docs_and_diagnosis_name_is_in_the_catalogue():
    """A phase or rank state named anywhere but in its family's entry is checked against it: a new value is one edit."""
    pytest.importorskip("grafana_foundation_sdk")
    from neuron_exporter.diagnosis.advice import _cause_text
    from neuron_exporter.mixin.build import files
    from neuron_exporter.mixin.rules import goodput, startup
    from neuron_exporter.training.host_reads import READS

    declared: dict[str, set[str]] = {}
    for family in FAMILIES.values():
        for label, values in family.values:
            declared.setdefault(label, set()).update(values)
    assert declared == {
        "phase": set(label_values.PHASES),
        "state": set(label_values.RANK_STATES),
        "cause": set(label_values.CUT_CAUSES),
    }
    matcher = re.compile(r'\b(phase|state|cause)\s*(=~|!~|!=|=)\s*\\?"([^"\\]*)\\?"')
    named = [
        (path, label, value)
        for path, text in files().items()
        for label, _, values in matcher.findall(text)
        for value in values.split("|")
        if value and "$" not in value  # a dashboard variable, not a value
    ]
    assert named and {(path, label, value) for path, label, value in named if value not in declared[label]} == set()
    assert set(goodput.ADVICE) == set(label_values.PHASES) - {label_values.GOODPUT_PHASE}
    assert set(startup.ADVICE) <= set(label_values.PHASES)
    assert set(READS.values()) == set(label_values.READ_CAUSES)  # the host-read wrappers' causes
    assert all(_cause_text(cause) != cause for cause in label_values.CUT_CAUSES)  # the diagnosis words each one
    guide = (ROOT / "docs" / "user-guide.md").read_text()
    table = guide.split("| phase | the training thread is | measured at |")[1].split("\n\n")[0]
    assert re.findall(r"^\| `(\w+)` \|", table, re.M) == [
        label_values.GOODPUT_PHASE,
        *(phase for phase in label_values.PHASES if phase != label_values.GOODPUT_PHASE),
    ]


def test_the_node_accepts_from_a_rank_the_namespaces_of_the_catalogues_per_rank_families():
    from neuron_exporter.node.exposition_check import RANK_PREFIXES, is_rank_family

    from_ranks = [family.name for family in FAMILIES.values() if family.per_rank and family.owner != catalogue.NODE]
    assert from_ranks and all(map(is_rank_family, from_ranks))
    assert not any(is_rank_family(family.name) for family in FAMILIES.values() if family.owner == catalogue.NODE)
    assert "xla_" in RANK_PREFIXES and "neuron_exporter_" in RANK_PREFIXES and "process_" not in RANK_PREFIXES
