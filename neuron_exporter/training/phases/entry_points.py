"""The functions and methods whose time is a phase, by the module that has them: each is wrapped once that module
is imported. A name a release lacks is passed over. An entry marked ``FUTURE`` returns futures (a
``concurrent.futures.Future``, or an object holding them): waiting on one (``result()``) is the same phase.

The data phase is the input pipelines' entry points (``training/input_pipelines.py``, shared with the throughput
source, which counts their batches): ``next()`` on a DataLoader's iterator, ``iter()`` of a DataLoader, and
torch_xla's per-device loader. A plain generator or any other iterable the loop draws from is not timed: its time
is the step's."""

from __future__ import annotations

from ..time_phases import CHECKPOINT

FUTURE = "future"

# module -> [(owner inside the module, '' for the module itself; attribute; phase[, FUTURE])]
ENTRY_POINTS: dict[str, list[tuple[str, ...]]] = {
    "torch": [("", "save", CHECKPOINT), ("", "load", CHECKPOINT)],
    "torch.serialization": [("", "save", CHECKPOINT), ("", "load", CHECKPOINT)],
    "torch_xla.core.xla_model": [("", "save", CHECKPOINT)],
    "torch.distributed.checkpoint": [
        ("", "save", CHECKPOINT),
        ("", "load", CHECKPOINT),
        ("", "save_state_dict", CHECKPOINT),
        ("", "load_state_dict", CHECKPOINT),
        ("", "async_save", CHECKPOINT, FUTURE),
    ],
    # Hugging Face's weights (the Trainer's checkpoints): imported by name, so wrapped before anyone binds them.
    "safetensors.torch": [
        ("", "save_file", CHECKPOINT),
        ("", "load_file", CHECKPOINT),
        ("", "save_model", CHECKPOINT),
        ("", "load_model", CHECKPOINT),
    ],
}
