"""Which run a process belongs to: the ``run_id`` label, so that runs on one machine never mix.

In order: ``NEURON_EXPORTER_RUN_ID`` (the ``run_id`` option; ``attach()`` and ``neuron-exporter run`` set it for
their children), torchrun's ``TORCHELASTIC_RUN_ID``, Slurm's job (and step), and otherwise the launcher's process:
the parent for a torchrun or multiprocessing worker, the process itself for a plain ``python train.py`` (so two of
them are two runs). A process-based id is ``<pid>-<start time>``, which no later process repeats.
"""

from __future__ import annotations

import multiprocessing
import os
import re
from collections.abc import Mapping

import psutil

RUN_ID_ENV = "NEURON_EXPORTER_RUN_ID"
MAX_LENGTH = 64
_UNSAFE = re.compile(r"[^A-Za-z0-9_.:-]")


def label_value(text: str) -> str:
    """``text`` as a bounded label value: characters outside A-Z a-z 0-9 _ . : - become _."""
    return _UNSAFE.sub("_", text.strip())[:MAX_LENGTH] or "_"


def _process_id(pid: int) -> str:
    try:
        started = int(psutil.Process(pid).create_time())
    except psutil.Error:
        started = 0
    return f"{pid}-{started}"


def run_id(env: Mapping[str, str] = os.environ) -> str:
    explicit = env.get(RUN_ID_ENV, "").strip()
    if explicit:
        return label_value(explicit)
    elastic = env.get("TORCHELASTIC_RUN_ID", "").strip()
    if elastic and elastic != "none":
        return label_value(elastic)
    slurm = env.get("SLURM_JOB_ID", "").strip()
    if slurm:
        step = env.get("SLURM_STEP_ID", "").strip()
        return label_value(f"{slurm}.{step}" if step else slurm)
    parent = multiprocessing.parent_process()
    if parent is not None and parent.pid:
        return _process_id(parent.pid)
    if "TORCHELASTIC_RUN_ID" in env:  # a torchrun worker without a rendezvous id: the agent is the run
        return _process_id(os.getppid())
    return _process_id(os.getpid())
