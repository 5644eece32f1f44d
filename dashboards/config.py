"""Every threshold, window and `for` duration of the alert rules, in one place.

Change a default here and run ``make dashboards`` to regenerate the rule files, or keep the defaults and
pass ``--thresholds my-thresholds.yml`` (a YAML mapping of the field names below) to
``python -m dashboards.build``.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import yaml

REPO_URL = "https://github.com/neuron-exporter/neuron-exporter"
RUNBOOK_PATH = "deploy/prometheus/runbook.md"
RUNBOOK_URL = f"{REPO_URL}/blob/main/{RUNBOOK_PATH}"

DURATION = re.compile(r"^(0|([0-9]+(ms|s|m|h|d|w|y))+)$")


@dataclasses.dataclass(frozen=True)
class Thresholds:
    # Scrape jobs that are neuron-exporter targets (used by the exporter-down alert only; every other rule
    # selects by metric name).
    exporter_job_selector: str = 'job=~".*neuron-exporter.*"'

    # XlaCpuFallbackOp: an aten:: operator ran on the CPU at least once within the window.
    fallback_window: str = "10m"
    fallback_for: str = "1m"

    # XlaRecompilationStorm: compiler runs after warm-up per step (0.1 = one step in ten recompiles).
    recompilations_per_step: float = 0.1
    recompilation_for: str = "10m"

    # XlaGraphFragmentation: graphs run per step on average (1.0 = no fragmentation).
    graphs_per_step: float = 1.5
    fragmentation_for: str = "15m"

    # XlaFrequentHostReads: device-to-host reads per step on average.
    host_reads_per_step: float = 0.5
    host_reads_for: str = "15m"

    # XlaCompileTimeDominates: share of the step wall time spent compiling (0.5 = half of it).
    compile_time_share: float = 0.5
    compile_time_for: str = "15m"

    # XlaTrainingStalled: no step ended within the window on a target that is up.
    stall_window: str = "10m"
    stall_for: str = "5m"

    # NeuronExporterRankHung / NeuronExporterRankDead: the node endpoint reports the rank as hung or dead.
    rank_hung_for: str = "1m"
    rank_dead_for: str = "0m"

    # NeuronExporterDown: Prometheus cannot scrape the endpoint.
    exporter_down_for: str = "5m"

    # NeuronExporterCollectionErrors / NeuronExporterCollectorFailing.
    collection_errors_window: str = "10m"
    collection_errors_for: str = "5m"
    collector_failing_for: str = "5m"

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.type == "str" and (field.name.endswith(("_for", "_window"))) and not DURATION.match(value):
                raise ValueError(f"{field.name}: {value!r} is not a Prometheus duration such as 30s, 5m or 1h")
            if field.type == "float" and not value >= 0:
                raise ValueError(f"{field.name}: {value!r} must be a number >= 0")


DEFAULTS = Thresholds()


class ThresholdsError(Exception):
    """A thresholds file that cannot be used; the message is one line naming the file, line and key."""


def load_thresholds(path: Path) -> Thresholds:
    """Defaults overridden by the YAML mapping in ``path``."""
    try:
        root = yaml.compose(path.read_text())
    except (OSError, yaml.YAMLError) as error:
        raise ThresholdsError(f"{path}: cannot read thresholds: {' '.join(str(error).split())}") from None
    if root is None:
        return DEFAULTS
    if not isinstance(root, yaml.MappingNode):
        raise ThresholdsError(f"{path}:{root.start_mark.line + 1}: expected a mapping of threshold names to values")
    types = {field.name: field.type for field in dataclasses.fields(Thresholds)}
    overrides = {}
    for key_node, value_node in root.value:
        where = f"{path}:{key_node.start_mark.line + 1}"
        key = key_node.value
        if key not in types:
            raise ThresholdsError(f"{where}: unknown threshold {key!r} (known: {', '.join(types)})")
        value = yaml.safe_load(yaml.serialize(value_node))
        if types[key] == "float":
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ThresholdsError(f"{where}: {key} must be a number, got {value!r}")
            value = float(value)
        elif not isinstance(value, str):
            raise ThresholdsError(f"{where}: {key} must be a string, got {value!r}")
        overrides[key] = value
    try:
        return dataclasses.replace(DEFAULTS, **overrides)
    except ValueError as error:
        raise ThresholdsError(f"{path}: {error}") from None
