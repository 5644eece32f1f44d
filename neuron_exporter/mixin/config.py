"""The one configuration of the rules and dashboards: a flat mapping of defaults, overridden key by key.

It follows the ``_config`` pattern of monitoring mixins: every selector, aggregation label, severity, ``for``
duration, window and threshold is a key of ``Config`` below, and a deployment overrides only the keys it
changes, from Python (``config_from({"selector": 'job="training"'})``, ``build.files(config)``) or from a YAML
file (``python -m neuron_exporter.mixin --config my-config.yml``). ``make dashboards`` writes the committed
files from the defaults. The thresholds' defaults are those of ``neuron_exporter.thresholds``, which ``explain``
uses too.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .. import thresholds
from ..config_file import ConfigError, YamlFile

REPO_URL = "https://github.com/neuron-exporter/neuron-exporter"
RUNBOOK_PATH = "deploy/prometheus/runbook.md"
RUNBOOK_URL = f"{REPO_URL}/blob/main/{RUNBOOK_PATH}"

SEVERITIES = ("critical", "warning", "info")
DURATION = re.compile(r"^(0|([0-9]+(ms|s|m|h|d|w|y))+)$")
LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
# Comma-separated label matchers, without braces: job="x", namespace=~"ml-.*"
MATCHERS = re.compile(r'^\s*([a-zA-Z_][a-zA-Z0-9_]*\s*(=~|!~|!=|=)\s*"(?:[^"\\]|\\.)*"\s*(,\s*|$))*$')
# Labels the rules add to every per-rank aggregation themselves.
RANK_LABELS = ("instance", "rank", "local_rank")


@dataclasses.dataclass(frozen=True)
class Config:
    # Label matchers (without braces) of the exporter's series, added to every metric the rules select and to
    # the dashboards' variables; "" selects by metric name only. NeuronExporterDown uses it on `up`, so it
    # should name the scrape jobs of neuron-exporter.
    selector: str = 'job=~".*neuron-exporter.*"'
    # Label matchers (without braces) of the device layer's series (neuron-monitor's, Neuron Observer's) that the
    # device rows join the ranks to, beside the dashboards' device job variable; "" selects by metric name only.
    device_selector: str = ""
    # Labels every alert keeps: one alert per value of these (one training run, by default). Per-rank
    # recording rules keep these plus instance, rank and local_rank. Add `pod` (or a team label) here, or
    # remove `run_id` to alert per job.
    aggregation_labels: tuple[str, ...] = ("cluster", "namespace", "job", "run_id")
    # Base of every alert's runbook_url; the alert adds "#<alert name in lower case>".
    runbook_url: str = RUNBOOK_URL

    # XlaCpuFallbackOp: an operator without an XLA lowering (aten::, torchvision::, a custom op) ran on the CPU at
    # least once within the window, per run and operator.
    fallback_window: str = "10m"
    fallback_for: str = "1m"
    fallback_severity: str = "warning"

    # XlaRecompilationStorm: recompilations (a computation compiled again for other shapes or values; new graphs do
    # not count) per training step, on some rank past its warm-up steps (0.1 = one step in ten recompiles).
    recompilations_per_step: float = thresholds.RECOMPILATIONS_PER_STEP
    recompilation_for: str = "10m"
    recompilation_severity: str = "warning"

    # XlaGraphFragmentation: graphs cut off before the step marker (.item(), print, `if t:`, a CPU fallback) per
    # training step, on some rank (0 = no fragmentation; gradient accumulation adds markers, not cuts).
    graph_cuts_per_step: float = thresholds.GRAPH_CUTS_PER_STEP
    fragmentation_for: str = "15m"
    fragmentation_severity: str = "warning"

    # XlaFrequentHostReads: device-to-host reads per training step, on some rank.
    host_reads_per_step: float = thresholds.HOST_READS_PER_STEP
    host_reads_for: str = "15m"
    host_reads_severity: str = "warning"

    # XlaCompileTimeDominates: share of the step wall time spent compiling (0.5 = half of it), on some rank.
    compile_time_share: float = thresholds.COMPILE_TIME_SHARE
    compile_time_for: str = "15m"
    compile_time_severity: str = "warning"

    # torch.compile (dynamo), for any backend. A rank counts as warmed up once its process has run for
    # torch_compile_warmup_window (its CPU-time counter existed that long ago and has not been reset since).
    # TorchCompileRecompiling: torch.compile recompilations on some warmed-up rank in every torch_compile_window,
    # for torch_compile_recompile_for (a one-off recompilation, such as a first eval batch, does not fire it).
    # TorchCompileRecompileLimit: a compiled function hit the recompile limit and runs eagerly from then on.
    # TorchCompileGraphBreaks: graph breaks found on some warmed-up rank in the last torch_compile_window (a code
    # path compiled late, or a recompilation that breaks).
    torch_compile_warmup_window: str = "10m"
    torch_compile_window: str = "10m"
    torch_compile_recompile_for: str = "10m"
    torch_compile_recompile_severity: str = "warning"
    torch_compile_limit_for: str = "0m"
    torch_compile_limit_severity: str = "warning"
    torch_compile_graph_break_for: str = "0m"
    torch_compile_graph_break_severity: str = "warning"

    # The training-time alerts (TrainingStartupSlow, TrainingGoodputLow) count live ranks only: a rank is live while
    # its process's CPU-time counter rose within live_window. The exporter's own spool writes move it every couple
    # of seconds whatever the training thread does (a long step, a compile, an evaluation), and it stops when the
    # process ends, while the node endpoint may serve a finished rank's last values for an hour. At least four
    # scrape intervals; a run that ended stops alerting within it.
    live_window: str = "1m"
    # A rank has started once it has made startup_steps training steps: its first steps compile the model's graphs
    # (torch_xla at the step markers of the first steps, torch.compile at the first forward and backward calls).
    startup_steps: float = 2

    # TrainingStartupSlow: a live rank that has not made its startup_steps training steps startup_max_seconds after
    # its process started (the time its training-time counters sum to: imports, model building, loading, the
    # first compilations), for startup_for. Set it from what a start-up of your model takes on your machines.
    startup_max_seconds: float = thresholds.STARTUP_MAX_SECONDS
    startup_for: str = "5m"
    startup_severity: str = "warning"

    # TrainingGoodputLow: a run's goodput (the share of its ranks' training-thread time spent in training steps,
    # over goodput_window; the rest is badput: startup, data, compile, host_sync, checkpoint, other) below
    # goodput_min, on any backend, counting the ranks that are live and had started when the window began (their
    # start-up is TrainingStartupSlow's). The description names the run's largest badput phase and what to do.
    goodput_min: float = thresholds.GOODPUT_MIN
    goodput_window: str = "30m"
    goodput_for: str = "15m"
    goodput_severity: str = "warning"

    # TrainingStraggler: in data-parallel training the ranks wait for the slowest at every collective, inside their
    # step. It fires for a rank whose seconds per training step in one phase (data, compile, host_sync, checkpoint)
    # exceed the run's median rank's by straggler_excess_share of the run's seconds per step (its median rank's, all
    # phases), over 5m, for straggler_for: one alert per run and straggler, for its largest phase. It needs a run of
    # at least straggler_min_ranks ranks that step, and a rank that is live, had made its startup_steps when the 5m
    # began and made at least straggler_min_steps steps in them.
    straggler_excess_share: float = thresholds.STRAGGLER_EXCESS_SHARE
    straggler_min_ranks: float = 4
    straggler_min_steps: float = 20
    straggler_for: str = "15m"
    straggler_severity: str = "warning"

    # TrainingThroughputDropped: a run's tokens per second (samples per second for a run without token ids) over 5m
    # below (1 - throughput_drop_share) of its recent level, its rate over throughput_recent_window ending
    # throughput_for + 5m ago (so the drop is not in it when the alert fires), for throughput_for. It judges a run
    # with a live rank that was served when its recent window began, whose busiest rank made at least
    # throughput_min_steps training steps per 5m over that window, on average. The description names the badput
    # phase whose share of the run's time grew the most between the two windows, and what to do about it.
    throughput_drop_share: float = 0.3
    throughput_recent_window: str = "1h"
    throughput_min_steps: float = 10
    throughput_for: str = "15m"
    throughput_severity: str = "warning"
    # TrainingPeakFlopsTooLow: a run's MFU above 1 (its FLOP/s above the peak its live ranks serve, which must then
    # be wrong) for peak_flops_for.
    peak_flops_for: str = "15m"
    peak_flops_severity: str = "info"

    # XlaTrainingStalled: no training step ended within the window on some rank whose endpoint answers.
    stall_window: str = "10m"
    stall_for: str = "5m"
    stall_severity: str = "warning"

    # NeuronExporterRankHung / NeuronExporterRankDead: the node endpoint reports ranks of a run hung or dead.
    # The `for` rides out a restart (the new process takes the rank over within a few seconds).
    rank_hung_for: str = "5m"
    rank_hung_severity: str = "warning"
    rank_dead_for: str = "5m"
    rank_dead_severity: str = "warning"

    # NeuronExporterDown: Prometheus cannot scrape an endpoint matching `selector`.
    exporter_down_for: str = "5m"
    exporter_down_severity: str = "warning"

    # NeuronExporterCollectionErrors / NeuronExporterCollectorFailing.
    collection_errors_window: str = "10m"
    collection_errors_for: str = "5m"
    collection_errors_severity: str = "warning"
    collector_failing_for: str = "5m"
    collector_failing_severity: str = "warning"

    # NeuronExporterSpoolFileRejected / NeuronExporterSpoolDirectoryNotOk: the node endpoint refuses a rank file
    # in the spool directory, or the whole directory.
    spool_rejected_for: str = "5m"
    spool_rejected_severity: str = "warning"
    spool_directory_for: str = "15m"
    spool_directory_severity: str = "warning"

    def __post_init__(self):
        for field in dataclasses.fields(self):
            name, value = field.name, getattr(self, field.name)
            kind = _kind(field)
            if kind is float:
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                    raise ValueError(f"{name}: {value!r} must be a number >= 0")
                object.__setattr__(self, name, float(value))
            elif kind is tuple:
                if isinstance(value, str) or not isinstance(value, (list, tuple)):
                    raise ValueError(f"{name}: {value!r} must be a list of label names")
                for label in value:
                    if not isinstance(label, str) or not LABEL_NAME.match(label):
                        raise ValueError(f"{name}: {label!r} is not a Prometheus label name")
                    if label in ("rank", "local_rank", "le", "__name__"):
                        raise ValueError(
                            f"{name}: {label!r} cannot be an aggregation label (alerts are per run; "
                            "per-rank detail is on the dashboards)"
                        )
                if len(set(value)) != len(value):
                    raise ValueError(f"{name}: {list(value)!r} names a label twice")
                object.__setattr__(self, name, tuple(value))
            elif not isinstance(value, str):
                raise ValueError(f"{name}: {value!r} must be a string")
            elif name.endswith(("_for", "_window")) and not DURATION.match(value):
                raise ValueError(f"{name}: {value!r} is not a Prometheus duration such as 30s, 5m or 1h")
            elif name.endswith("_severity") and value not in SEVERITIES:
                raise ValueError(f"{name}: {value!r} is not one of {', '.join(SEVERITIES)}")
            elif name in ("selector", "device_selector") and not MATCHERS.match(value):
                raise ValueError(
                    f"{name}: {value!r} is not a list of label matchers such as "
                    'job="neuron-exporter", namespace=~"ml-.*" (without braces)'
                )
        if not self.throughput_drop_share < 1:
            raise ValueError(
                f"throughput_drop_share: {self.throughput_drop_share!r} must be below 1 (a share of the rate)"
            )

    def as_dict(self) -> dict[str, Any]:
        """The configuration as a plain mapping (lists for the label tuples), the form ``config_from`` takes."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}

    # Label lists of the generated PromQL.
    @property
    def run_labels(self) -> tuple[str, ...]:
        return self.aggregation_labels

    @property
    def rank_labels(self) -> tuple[str, ...]:
        return self.aggregation_labels + tuple(label for label in RANK_LABELS if label not in self.aggregation_labels)


def _kind(field: dataclasses.Field) -> type:
    annotation = str(field.type)
    return float if annotation == "float" else tuple if annotation.startswith("tuple") else str


DEFAULTS = Config()
FIELDS = tuple(field.name for field in dataclasses.fields(Config))


def config_from(overrides: Mapping[str, Any] | Config | None = None) -> Config:
    """The defaults with ``overrides`` (a mapping of the keys of ``Config``) applied."""
    if overrides is None:
        return DEFAULTS
    if isinstance(overrides, Config):
        return overrides
    if not isinstance(overrides, Mapping):
        raise ConfigError(f"expected a mapping of configuration keys to values, got {type(overrides).__name__}")
    for key in overrides:
        if key not in FIELDS:
            raise ConfigError(f"unknown configuration key {key!r} (known: {', '.join(FIELDS)})")
    try:
        return dataclasses.replace(DEFAULTS, **overrides)
    except ValueError as error:
        raise ConfigError(str(error)) from None


def load_config(path: Path) -> Config:
    """Defaults overridden by the YAML mapping in ``path``."""
    document = YamlFile(path, "configuration")
    entries = document.mapping(document.root, "expected a mapping of configuration keys to values")
    overrides = {}
    for key, (key_node, value_node) in entries.items():
        if key not in FIELDS:
            raise document.error(f"unknown configuration key {key!r} (known: {', '.join(FIELDS)})", key_node)
        value = document.value(value_node, key)
        try:
            dataclasses.replace(DEFAULTS, **{key: value})
        except ValueError as error:
            raise document.error(str(error), key_node) from None
        overrides[key] = value
    return config_from(overrides)
