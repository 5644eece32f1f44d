"""The metric names the dashboards and rules may use (the exporter's contract: every series of the catalogue, and
Prometheus' own ``up``; and, on the device rows, the device layer's, which the exporter does not serve) and a PromQL
name extractor."""

from __future__ import annotations

import re

from neuron_exporter.catalogue import SERIES
from neuron_exporter.mixin.device_layer import NEURON_MONITOR_SERIES

PROMETHEUS_OWN = {"up"}

CONTRACT_METRICS = SERIES | PROMETHEUS_OWN
DEVICE_METRICS = NEURON_MONITOR_SERIES


PROMQL_WORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "inf",
    "nan",
    # aggregation operators, which may stand before their parenthesis: sum by (x) (...)
    "sum",
    "avg",
    "min",
    "max",
    "count",
    "group",
    "stddev",
    "stdvar",
    "topk",
    "bottomk",
    "quantile",
    "count_values",
}


def metric_names(expr: str) -> set[str]:
    """The metric names an expression selects: identifiers that are not functions, keywords or label names."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings (label values, regexes)
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # range and subquery windows
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", r" \1 ", text)  # label lists
    names = set()
    for match in re.finditer(r"(?<![\w.])([A-Za-z_:][A-Za-z0-9_:]*)(\s*\()?", text):
        word, is_call = match.group(1), match.group(2)
        if not is_call and word.lower() not in PROMQL_WORDS:
            names.add(word)
    return names
