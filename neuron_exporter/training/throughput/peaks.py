"""The peak of a rank's devices for the data type it trains in (``training_peak_flops``), from the AWS Neuron
documentation's figures for each Trainium generation.

The pages give each chip's dense figures for all its NeuronCores together; a NeuronCore's share is the chip's over
its physical cores (the NeuronCore pages quote the Tensor Engine alone: "over 90" BF16 TFLOPS for NeuronCore-v2, 79
for NeuronCore-v3; the chip's figures add the other engines). A rank's peak is its NeuronCores' (``rank_cores``):
each logical NeuronCore is ``NEURON_LOGICAL_NC_CONFIG`` physical ones (LNC: 2 by default on Trainium2 and Trainium3,
1 on NeuronCore-v2, which has none).

The generation comes from the Neuron driver's sysfs, without the runtime: a NeuronCore's ``arch_type`` (``NCv2``),
else the device's ``device_name`` (``trainium2``). The data type is that of the first floating-point parameter of
the first optimizer the rank steps. FP32 on an XLA device is what neuronx-cc makes of it: with ``--auto-cast
matmult`` or ``all`` in ``NEURON_CC_FLAGS`` its matrix multiplications run in ``--auto-cast-type`` (BF16 unless
set), the peak that bounds them; without (``none``, the compiler's default since Neuron 2.27), FP32.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..neuroncores import MAX_CORES, logical_config, visible_cores

BF16, FP16, TF32, FP8, FP32 = "bf16", "fp16", "tf32", "fp8", "fp32"
TERA = 1e12
PAGES = "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/about-neuron/arch/neuron-hardware/"


@dataclass(frozen=True)
class Generation:
    neuroncore: str
    chips: str  # the chips (and instances) it is in
    physical_cores: int  # of a chip
    chip_tflops: dict[str, float]  # a chip's dense TFLOPS, by data type, as the page gives them
    pages: tuple[str, ...]  # where the figures are
    default_lnc: int  # physical cores in a logical one when NEURON_LOGICAL_NC_CONFIG is unset

    def flops(self, kind: str) -> float | None:
        """Peak FLOP/s of one physical NeuronCore for data type ``kind``; None if the pages give none."""
        tflops = self.chip_tflops.get(kind)
        return None if tflops is None else tflops * TERA / self.physical_cores


GENERATIONS: dict[int, Generation] = {
    # "Two NeuronCore-v2 delivering 380 INT8 TOPS, 190 FP16/BF16/cFP8/TF32 TFLOPS, and 47.5 FP32 TFLOP(S)": the same
    # words for a Trainium chip and an Inferentia2 chip.
    2: Generation(
        "NeuronCore-v2",
        "Trainium (trn1, trn1n), Inferentia2 (inf2)",
        2,
        {BF16: 190, FP16: 190, TF32: 190, FP8: 190, FP32: 47.5},
        (PAGES + "trainium.html", PAGES + "inferentia2.html"),
        1,
    ),
    # "Eight NeuronCore-v3 that collectively deliver: 1,299 FP8 TFLOPS, 667 BF16/FP16/TF32 TFLOPS, 2,563
    # FP8/FP16/BF16/TF32 sparse TFLOPS, 181 FP32 TFLOPS"
    3: Generation(
        "NeuronCore-v3",
        "Trainium2 (trn2)",
        8,
        {BF16: 667, FP16: 667, TF32: 667, FP8: 1299, FP32: 181},
        (PAGES + "trainium2.html",),
        2,
    ),
    # "Eight NeuronCore-v4 cores that collectively deliver: 2,517 MXFP8/MXFP4 TFLOPS, 671 BF16/FP16/TF32 TFLOPS,
    # 2,517 FP16/BF16/TF32 sparse TFLOPS, 183 FP32 TFLOPS"; FP8 2517 in the page's comparison with Trainium2.
    4: Generation(
        "NeuronCore-v4",
        "Trainium3 (trn3)",
        8,
        {BF16: 671, FP16: 671, TF32: 671, FP8: 2517, FP32: 183},
        (PAGES + "trainium3.html",),
        2,
    ),
}

# torch's name of a parameter's dtype -> the data type of the tables
KINDS = {
    "torch.bfloat16": BF16,
    "torch.float16": FP16,
    "torch.float32": FP32,
    "torch.float8_e4m3fn": FP8,
    "torch.float8_e4m3fnuz": FP8,
    "torch.float8_e5m2": FP8,
    "torch.float8_e5m2fnuz": FP8,
}
AUTO_CAST_TYPES = {"bf16": BF16, "fp16": FP16, "tf32": TF32, "fp8_e4m3": FP8}  # neuronx-cc's --auto-cast-type
NEURON_DEVICES = ("xla", "neuron")  # torch_xla's device (on Neuron through its PJRT plugin), TorchNeuron's

SYSFS = Path("/sys/devices/virtual/neuron_device")
CORE_ARCH = re.compile(r"(?:NC)?_?v([0-9])d?", re.IGNORECASE)  # a NeuronCore's arch_type: NCv2, NCv3, NCv3d
DEVICE_NAMES = {"trainium": 2, "trainium1": 2, "inferentia2": 2, "trainium2": 3, "trainium3": 4}
MAX_DEVICES_LOOKED_AT = 4
MAX_READ = 64


def _read(path: Path) -> str | None:
    try:
        with open(path, "rb") as file:
            return file.read(MAX_READ).decode("ascii", "replace").strip()
    except OSError:
        return None


def neuroncore_version(root: Path = SYSFS) -> int | None:
    """The version of this machine's NeuronCores (2 for NeuronCore-v2) from the driver's sysfs under ``root``;
    None where there is none (no Neuron device, no driver) or it names none the tables have."""
    try:
        devices = sorted(
            (entry for entry in root.iterdir() if re.fullmatch(r"neuron[0-9]{1,4}", entry.name)),
            key=lambda entry: int(entry.name[len("neuron") :]),
        )[:MAX_DEVICES_LOOKED_AT]
    except OSError:
        return None
    for device in devices:
        arch = _read(device / "neuron_core0" / "info" / "architecture" / "arch_type")
        match = CORE_ARCH.fullmatch(arch or "")
        if match and int(match.group(1)) in GENERATIONS:
            return int(match.group(1))
        version = DEVICE_NAMES.get((_read(device / "info" / "architecture" / "device_name") or "").lower())
        if version is not None:
            return version
    return None


def rank_cores(env: Mapping[str, str]) -> int:
    """The logical NeuronCores of the rank: those ``NEURON_RT_VISIBLE_CORES`` names, else ``NEURON_RT_NUM_CORES`` of
    them, else one (a PyTorch process trains on one logical NeuronCore by default)."""
    cores = visible_cores(env)
    if cores:
        return len(cores)
    text = env.get("NEURON_RT_NUM_CORES", "").strip()
    if text.isdigit() and 0 < int(text) <= MAX_CORES:
        return int(text)
    return 1


def auto_cast(flags: str) -> str | None:
    """The data type neuronx-cc casts FP32 matrix multiplications to under the compiler flags ``flags``
    (``NEURON_CC_FLAGS``); None if it casts none. The right-most of a flag given twice wins, as in the compiler."""
    mode, cast_type = "none", "bf16"
    words = flags.split()
    for index, word in enumerate(words):
        name, equals, value = word.partition("=")
        if not equals:
            value = words[index + 1] if index + 1 < len(words) else ""
        if name == "--auto-cast":
            mode = value.lower()
        elif name == "--auto-cast-type":
            cast_type = value.lower()
    if mode not in ("matmult", "all"):
        return None
    return AUTO_CAST_TYPES.get(cast_type)


def data_type(dtype: str, device: str, env: Mapping[str, str]) -> str | None:
    """The tables' data type for parameters of ``dtype`` (torch's name) on a device of type ``device``."""
    kind = KINDS.get(dtype)
    if kind == FP32 and device == "xla":
        return auto_cast(env.get("NEURON_CC_FLAGS", "")) or FP32
    return kind


def on_neuron(device: str, env: Mapping[str, str]) -> bool:
    """Whether parameters on a device of type ``device`` are on a NeuronCore: TorchNeuron's device, or torch_xla's
    unless ``PJRT_DEVICE`` names another device (``CPU``, ``TPU``, ``CUDA``)."""
    if device == "xla":
        return env.get("PJRT_DEVICE", "NEURON").strip().upper() in ("NEURON", "")
    return device in NEURON_DEVICES


def table_peak(version: int | None, dtype: str, device: str, env: Mapping[str, str]) -> float | None:
    """The rank's peak FLOP/s from the tables: NeuronCores of ``version``, parameters of ``dtype`` on ``device``;
    None if it trains elsewhere or the tables have no figure for it."""
    generation = GENERATIONS.get(version) if version is not None else None
    if generation is None or not on_neuron(device, env):
        return None
    kind = data_type(dtype, device, env)
    flops = generation.flops(kind) if kind is not None else None
    if flops is None:
        return None
    lnc = int(logical_config(env) or generation.default_lnc) if generation.default_lnc > 1 else 1
    return flops * lnc * rank_cores(env)
