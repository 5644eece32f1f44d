"""The process's ``runtime_tag``, as neuron-monitor labels its series: ``NEURON_PROCESS_TAG`` as the process had it
when the Neuron runtime started, else the process id. With the ``process_tag`` option, ``attach()`` sets the tag to
the rank it is (``<run_id>.rank<rank>``, or ``<run_id>.pid<pid>`` before a launcher has said the rank) while the
runtime has not started, so that a person reading neuron-monitor's series knows the process, and so that the tag
is one that joins where the process ids of the training container and of neuron-monitor's differ (another PID
namespace). The runtime reads the tag once, when it starts: later, it is too late, and one line says so.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping, MutableMapping
from pathlib import Path

from ..untrusted import quoted
from .rank import RANK_VARIABLES

log = logging.getLogger("neuron_exporter")

PROCESS_TAG_ENV = "NEURON_PROCESS_TAG"
MAX_TAG = 255  # characters the runtime keeps
FD_DIR = Path("/proc/self/fd")
DEVICE_PREFIX = "/dev/neuron"

_warned: set[str] = set()


def runtime_started(fd_dir: Path = FD_DIR) -> bool:
    """Whether the Neuron runtime runs in this process: it holds a Neuron device (``/dev/neuronN``) open from its
    start. Unknown (no /proc) reads as not started."""
    try:
        descriptors = list(fd_dir.iterdir())
    except OSError:
        return False
    for descriptor in descriptors:
        try:
            if os.readlink(descriptor).startswith(DEVICE_PREFIX):
                return True
        except OSError:  # closed since it was listed
            continue
    return False


def readable_tag(labels: Mapping[str, str], env: Mapping[str, str]) -> str:
    """The tag of the rank ``labels`` name: ``<run_id>.rank<rank>``, or ``<run_id>.pid<pid>`` while no launcher's
    variable says the rank (a rank read as 0 by default would give every process of a spawn the same tag)."""
    if any(env.get(name, "").strip().isdigit() for name in RANK_VARIABLES):
        return f"{labels['run_id']}.rank{labels['rank']}"
    return f"{labels['run_id']}.pid{os.getpid()}"


def _set_by_this_run(tag: str, run_id: str) -> bool:
    """Whether ``tag`` is one this run's exporter set, in the parent this process inherited it from."""
    return tag.startswith(run_id + ".") and re.fullmatch(r"(rank|pid)[0-9]+", tag[len(run_id) + 1 :]) is not None


def apply_process_tag(
    labels: Mapping[str, str], env: MutableMapping[str, str] = os.environ, fd_dir: Path = FD_DIR
) -> None:
    """Set ``NEURON_PROCESS_TAG`` to this rank's readable tag, unless the user set a tag of their own or the
    runtime has started (then one line says which tag neuron-monitor shows)."""
    current = env.get(PROCESS_TAG_ENV, "")
    if current and not _set_by_this_run(current, labels["run_id"]):
        log.info("neuron-exporter: process_tag: %s is already %s, left as it is", PROCESS_TAG_ENV, quoted(current))
        return
    if runtime_started(fd_dir):
        log.warning(
            "neuron-exporter: process_tag: the Neuron runtime started in this process before attach(), so "
            "%s cannot change any more: neuron-monitor labels this process runtime_tag=%s. Call attach() before "
            "the first use of the device to tag it.",
            PROCESS_TAG_ENV,
            quoted(current or str(os.getpid())),
        )
        return
    env[PROCESS_TAG_ENV] = readable_tag(labels, env)


def runtime_tag(env: Mapping[str, str] = os.environ) -> str:
    """The ``runtime_tag`` neuron-monitor gives this process's series: the tag, or the process id. A tag the
    runtime would not keep as it is (too long, not text) gives one warning and an empty label."""
    tag = env.get(PROCESS_TAG_ENV, "")
    if not tag:
        return str(os.getpid())
    if len(tag) <= MAX_TAG and tag.isprintable():
        return tag
    if tag not in _warned:
        _warned.add(tag)
        log.warning(
            "neuron-exporter: %s=%s is not used for runtime_tag: expected at most %d printable characters",
            PROCESS_TAG_ENV,
            quoted(tag),
            MAX_TAG,
        )
    return ""
