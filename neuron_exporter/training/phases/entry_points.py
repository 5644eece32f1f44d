"""The functions and methods whose time is a phase, by the module that has them: each is wrapped once that module
is imported. A name a release lacks is passed over."""

from __future__ import annotations

from ..time_phases import CHECKPOINT, DATA

# module -> [(owner inside the module, '' for the module itself; attribute; phase)]
ENTRY_POINTS: dict[str, list[tuple[str, str, str]]] = {
    # Every DataLoader iterator (single- and multi-process) takes its batches through the base class's __next__.
    "torch.utils.data.dataloader": [("_BaseDataLoaderIter", "__next__", DATA)],
    # torch_xla's MpDeviceLoader hands the training thread its batches here (and runs a step marker in it).
    "torch_xla.distributed.parallel_loader": [("PerDeviceLoader", "__next__", DATA)],
    "torch": [("", "save", CHECKPOINT), ("", "load", CHECKPOINT)],
    "torch.serialization": [("", "save", CHECKPOINT), ("", "load", CHECKPOINT)],
    "torch_xla.core.xla_model": [("", "save", CHECKPOINT)],
    "torch.distributed.checkpoint": [
        ("", "save", CHECKPOINT),
        ("", "load", CHECKPOINT),
        ("", "save_state_dict", CHECKPOINT),
        ("", "load_state_dict", CHECKPOINT),
    ],
    # Hugging Face's weights (the Trainer's checkpoints): imported by name, so wrapped before anyone binds them.
    "safetensors.torch": [
        ("", "save_file", CHECKPOINT),
        ("", "load_file", CHECKPOINT),
        ("", "save_model", CHECKPOINT),
        ("", "load_model", CHECKPOINT),
    ],
}
