"""The exporter's account of itself: errors by stage, time spent in the step hook, build versions."""

from __future__ import annotations

import logging
import platform
from importlib import metadata

from .. import __version__

log = logging.getLogger("neuron_exporter")

STAGES = ("step", "scrape", "spool")
STAGE_NAMES = {"step": "step hook", "scrape": "scrape", "spool": "spool write"}
# Log the first failures of a stage in full, then only every Nth, so a broken exporter cannot flood a job's log.
LOG_FIRST = 3
LOG_EVERY = 1000


class SelfStats:
    def __init__(self):
        self.errors = dict.fromkeys(STAGES, 0)
        self.hook_seconds = 0.0

    def record_error(self, stage: str, error: BaseException) -> None:
        self.errors[stage] += 1
        count = self.errors[stage]
        if count <= LOG_FIRST or count % LOG_EVERY == 0:
            log.warning("neuron-exporter: %s failed (%d so far), training goes on: %s: %s",
                        STAGE_NAMES[stage], count, type(error).__name__, error, exc_info=count <= LOG_FIRST)


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "none"


def build_labels() -> dict[str, str]:
    return {
        "version": __version__,
        "torch_version": _version("torch"),
        "torch_xla_version": _version("torch-xla"),
        "python_version": platform.python_version(),
    }
