"""The rank labels of this process, from the environment only.

Asking torch_xla (``xr.global_ordinal()``) would start the PJRT runtime, which breaks ``xmp.spawn`` when done in
the parent, and under torchrun it reads 0 in every rank until distributed init. The launchers' variables are
cheap and right: torchrun sets RANK/LOCAL_RANK, xmp.spawn sets PJRT_LOCAL_PROCESS_RANK, Neuron sets
NEURON_PJRT_PROCESS_INDEX.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

RANK_VARIABLES = ("RANK", "LOCAL_RANK", "PJRT_LOCAL_PROCESS_RANK", "NEURON_PJRT_PROCESS_INDEX")
LOCAL_RANK_VARIABLES = ("LOCAL_RANK", "PJRT_LOCAL_PROCESS_RANK")


def _first_integer(env: Mapping[str, str], names: tuple[str, ...]) -> str | None:
    for name in names:
        value = env.get(name, "").strip()
        if value.isascii() and value.isdigit() and len(value) <= 9:
            return str(int(value))  # "007" and "7" are the same rank; anything else is not a rank
    return None


def rank_labels(env: Mapping[str, str] = os.environ) -> dict[str, str]:
    rank = _first_integer(env, RANK_VARIABLES) or "0"
    local_rank = _first_integer(env, LOCAL_RANK_VARIABLES) or rank
    return {"rank": rank, "local_rank": local_rank}
