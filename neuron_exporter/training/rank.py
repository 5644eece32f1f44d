"""The rank labels of this process, from the environment only.

Asking torch_xla (``xr.global_ordinal()``) would start the PJRT runtime, which breaks ``xmp.spawn`` when done in
the parent, and under torchrun it reads 0 in every rank until distributed init. The launchers' variables are
cheap and right: torchrun sets RANK/LOCAL_RANK, xmp.spawn sets PJRT_LOCAL_PROCESS_RANK, Neuron sets
NEURON_PJRT_PROCESS_INDEX. The run comes from ``run_identity``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from .. import run_identity

RANK_VARIABLES = ("RANK", "LOCAL_RANK", "PJRT_LOCAL_PROCESS_RANK", "NEURON_PJRT_PROCESS_INDEX")
LOCAL_RANK_VARIABLES = ("LOCAL_RANK", "PJRT_LOCAL_PROCESS_RANK")
RUN_VARIABLES = (run_identity.RUN_ID_ENV, "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "SLURM_STEP_ID")
WORKLOAD = {"pod": "POD_NAME", "namespace": "POD_NAMESPACE", "node": "NODE_NAME", "container": "CONTAINER_NAME"}


def _first_integer(env: Mapping[str, str], names: tuple[str, ...]) -> str | None:
    for name in names:
        value = env.get(name, "").strip()
        if value.isascii() and value.isdigit() and len(value) <= 9:
            return str(int(value))  # "007" and "7" are the same rank; anything else is not a rank
    return None


_run_ids: dict[tuple, str] = {}  # (pid, the variables it comes from) -> run id: it costs a process look-up


def rank_labels(env: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The labels every series of this process carries: its run, rank and local rank."""
    rank = _first_integer(env, RANK_VARIABLES) or "0"
    local_rank = _first_integer(env, LOCAL_RANK_VARIABLES) or rank
    key = (os.getpid(), *(env.get(name) for name in RUN_VARIABLES))
    run_id = _run_ids.get(key)
    if run_id is None:
        run_id = _run_ids[key] = run_identity.run_id(env)
    return {"run_id": run_id, "rank": rank, "local_rank": local_rank}


def workload_labels(env: Mapping[str, str] = os.environ) -> dict[str, str]:
    """Where the process runs in Kubernetes, from the downward-API variables the shipped manifests set."""
    return {label: run_identity.label_value(env[name]) if env.get(name) else "" for label, name in WORKLOAD.items()}
