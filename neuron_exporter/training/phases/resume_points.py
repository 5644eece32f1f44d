"""Where a process resumes the run from, without user code: the step count in an optimizer's restored state (Adam,
AdamW, Adagrad, RMSprop and the like keep one per parameter), and an LR scheduler's restored ``last_epoch``. Read
from the state handed to ``load_state_dict`` as it is loaded: a number, or a tensor on the CPU (one on a device is
passed over: reading it would wait for the device)."""

from __future__ import annotations

from collections.abc import Mapping

from ..rank_run import OPTIMIZER, SCHEDULER

MAX_STEP = 2**53

# module -> (class, method, kind): each class's load_state_dict, which its subclasses call
RESUME_POINTS: dict[str, tuple[str, str, str]] = {
    "torch.optim.optimizer": ("Optimizer", "load_state_dict", OPTIMIZER),
    "torch.optim.lr_scheduler": ("LRScheduler", "load_state_dict", SCHEDULER),
}


def restored_step(kind: str, state_dict: object) -> int | None:
    """The steps the state ``state_dict`` of an optimizer or scheduler (``kind``) had made; None if it does not say."""
    if not isinstance(state_dict, Mapping):
        return None
    if kind == SCHEDULER:
        return _count(state_dict.get("last_epoch"))
    state = state_dict.get("state")
    if not isinstance(state, Mapping):
        return None
    steps = [_count(entry.get("step")) for entry in state.values() if isinstance(entry, Mapping)]
    known = [step for step in steps if step is not None]
    return max(known) if known else None


def _count(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return int(value) if 0 <= value < MAX_STEP else None
    device = getattr(value, "device", None)
    if getattr(device, "type", None) == "cpu" and value.numel() == 1:  # type: ignore[attr-defined]
        return _count(value.item())  # type: ignore[attr-defined]
    return None
