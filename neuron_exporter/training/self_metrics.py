"""The exporter's account of itself: errors by stage, time spent in the step hook, build versions."""

from __future__ import annotations

import functools
import logging
import platform
from importlib import metadata

from .. import __version__, fork_safe

log = logging.getLogger("neuron_exporter")

STAGES = ("step", "scrape", "spool")
STAGE_NAMES = {"step": "step hook", "scrape": "scrape", "spool": "spool write"}
# Each distinct failure is logged once, in one line (its traceback only at debug level); the metric counts them
# all. A bounded number of distinct failures, so a broken exporter cannot flood a job's log.
MAX_LOGGED_FAILURES = 20
MAX_MESSAGE = 300
START_TRIES = 10  # attempts to start a source whose library is imported (``source``); then it stays off


class SelfStats:
    def __init__(self):
        self.errors = dict.fromkeys(STAGES, 0)
        self.hook_seconds = 0.0
        self.sources: dict[str, bool] = {}  # a source whose library is imported -> whether its hooks are in
        self._logged: set[tuple[str, str, str]] = set()
        self._lock = fork_safe.Lock()

    def record_error(self, stage: str, error: BaseException) -> None:
        message = str(error)[:MAX_MESSAGE]
        key = (stage, type(error).__name__, message)
        with self._lock:
            self.errors[stage] += 1
            count = self.errors[stage]
            first = key not in self._logged and len(self._logged) < MAX_LOGGED_FAILURES
            if first:
                self._logged.add(key)
        if first:
            log.warning(
                "neuron-exporter: %s failed, training goes on (logged once; "
                'neuron_exporter_collection_errors_total{stage="%s"} counts every failure, %d so far): '
                "%s: %s",
                STAGE_NAMES[stage],
                stage,
                count,
                type(error).__name__,
                message,
            )
            log.debug("neuron-exporter: %s failure", STAGE_NAMES[stage], exc_info=error)


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "none"


@functools.cache  # installed versions do not change while a process runs; reading them cost 6% of a scrape
def build_labels() -> dict[str, str]:
    return {
        "version": __version__,
        "torch_version": _version("torch"),
        "torch_xla_version": _version("torch-xla"),
        "python_version": platform.python_version(),
    }
