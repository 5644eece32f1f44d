"""Prometheus recording and alert rules for neuron-exporter, generated from the configuration in ../config.py.

Recording rules (recording.py, and straggler.py's and throughput.py's in groups of their own) hold the per-rank ratios
and rates (per ``aggregation_labels`` + instance, rank, local_rank, over a fixed 5m window so their names stay stable)
and the per-run ratios by site (per ``aggregation_labels`` + location, and cause for graph cuts). Training alerts are
per run (``aggregation_labels``, by default cluster, namespace, job and run_id) and, where it applies, per operator or
stage: a CPU-fallback operator on all 2,048 ranks of a job is one alert. Its value is the number of ranks affected, and
its description names the worst rank and, for graph cuts and recompilations, the top site (template queries); the
per-rank and per-site detail is on the dashboards. Every alert carries a ``severity`` label and the annotations
``summary``, ``description`` and ``runbook_url`` (the configured base URL and an anchor named after the alert).

Every expression and annotation is written out as one PromQL or Go-template text in which ``${name}`` stands for
what the configuration decides (labels, selectors, windows, thresholds) and is filled in by ``promql.fill``. The
alerts come in one group per area, a module each: XLA training (xla.py), torch.compile (torch_compile.py),
TorchNeuron (torchneuron.py), start-up, goodput, stragglers and throughput on every backend (startup.py,
goodput.py, straggler.py, throughput.py, which count the ranks of rank_filters.py), and the exporter itself
(exporter.py). A new source adds its module and its line in ``ALERT_GROUPS``.
"""

from __future__ import annotations

from collections.abc import Callable

from ..config import DEFAULTS, Config
from .exporter import exporter_alerts
from .goodput import goodput_alerts
from .recording import recording_rules
from .startup import startup_alerts
from .straggler import straggler_alerts, straggler_recording_rules
from .throughput import throughput_alerts, throughput_recording_rules
from .torch_compile import torch_compile_alerts
from .torchneuron import torchneuron_alerts
from .xla import xla_alerts

ALERTS_FILE = "neuron-exporter-alerts.yml"
RECORDING_FILE = "neuron-exporter-recording.yml"

# The rule groups: recording rules first (the alerts read them), then the alerts by area. The straggler's and the
# throughput's recording rules are groups of their own: Prometheus evaluates groups side by side, and each keeps its
# own order.
RECORDING_GROUPS: dict[str, Callable[[Config], dict[str, str]]] = {
    "neuron-exporter.xla.recording": recording_rules,
    "neuron-exporter.straggler.recording": straggler_recording_rules,
    "neuron-exporter.throughput.recording": throughput_recording_rules,
}
ALERT_GROUPS: dict[str, Callable[[Config], list[dict]]] = {
    "neuron-exporter.xla": xla_alerts,
    "neuron-exporter.torch_compile": torch_compile_alerts,
    "neuron-exporter.torchneuron": torchneuron_alerts,
    "neuron-exporter.startup": startup_alerts,
    "neuron-exporter.goodput": goodput_alerts,
    "neuron-exporter.straggler": straggler_alerts,
    "neuron-exporter.throughput": throughput_alerts,
    "neuron-exporter.exporter": exporter_alerts,
}


def alert_rules(c: Config = DEFAULTS) -> list[dict]:
    """Every alert, group after group."""
    return [rule for alerts in ALERT_GROUPS.values() for rule in alerts(c)]


def rule_files(c: Config = DEFAULTS) -> dict[str, dict]:
    """{file name: rule file content} for the two files Prometheus loads."""
    recording = [
        {"name": name, "rules": [{"record": record, "expr": expr} for record, expr in group(c).items()]}
        for name, group in RECORDING_GROUPS.items()
    ]
    return {
        RECORDING_FILE: {"groups": recording},
        ALERTS_FILE: {"groups": [{"name": name, "rules": alerts(c)} for name, alerts in ALERT_GROUPS.items()]},
    }


RECORDING_RULES = {name: expr for group in RECORDING_GROUPS.values() for name, expr in group(DEFAULTS).items()}
"""The default expressions of every recording rule, by name."""
