"""Which run a process belongs to: the ``run_id`` label, so that runs on one machine never mix.

In order: ``NEURON_EXPORTER_RUN_ID`` (the ``run_id`` option; ``attach()`` and ``neuron-exporter run`` set it for
their children), torchrun's ``TORCHELASTIC_RUN_ID``, Slurm's job (and step), and otherwise the launcher's process:
the parent for a torchrun or multiprocessing worker, the process itself for a plain ``python train.py`` (so two of
them are two runs). A process-based id is ``<pid>-<start time>-<PID namespace>``, which no later process repeats, nor
a process of another container (two containers' first processes both have pid 1).

The label is the id as given when it is printable and at most ``MAX_LENGTH`` characters; otherwise it is cut, and a
hash of the whole id added, so that two ids never share a label.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
from collections.abc import Mapping

import psutil

RUN_ID_ENV = "NEURON_EXPORTER_RUN_ID"
MAX_LENGTH = 128
HASH_LENGTH = 16


def label_value(text: str) -> str:
    """``text`` as a bounded label value: itself when printable and at most ``MAX_LENGTH`` characters, else its
    printable characters cut short and ``~`` with a hash of the whole (distinct texts keep distinct values)."""
    text = text.strip()
    if text and text.isprintable() and len(text) <= MAX_LENGTH:
        return text
    kept = "".join(character for character in text if character.isprintable())[: MAX_LENGTH - HASH_LENGTH - 1]
    return f"{kept}~{hashlib.sha256(text.encode('utf-8', 'surrogatepass')).hexdigest()[:HASH_LENGTH]}"


def _pid_namespace() -> str:
    try:
        return f"-{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return ""


def _process_id(pid: int) -> str:
    try:
        started = int(psutil.Process(pid).create_time())
    except psutil.Error:
        started = 0
    return f"{pid}-{started}{_pid_namespace()}"


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
