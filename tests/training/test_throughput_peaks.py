"""The peak of a rank's devices (``throughput.peaks``): the Neuron documentation's figures for each generation, the
data type the rank trains in (and what neuronx-cc casts FP32 to), its NeuronCores and the logical-core
configuration; the generation from the driver's sysfs, laid out here as the Neuron sysfs user guide shows it."""

from __future__ import annotations

from pathlib import Path

import pytest

from neuron_exporter.training.throughput.peaks import (
    GENERATIONS,
    auto_cast,
    data_type,
    neuroncore_version,
    rank_cores,
    table_peak,
)

T = 1e12
NEURON = {"PJRT_DEVICE": "NEURON"}


def test_every_figure_names_the_page_it_comes_from():
    for generation in GENERATIONS.values():
        assert generation.pages and all(page.startswith("https://awsdocs-neuron.") for page in generation.pages)
        assert set(generation.chip_tflops) == {"bf16", "fp16", "tf32", "fp8", "fp32"}


@pytest.mark.parametrize(
    ("version", "dtype", "env", "peak"),
    [
        # NeuronCore-v2: a Trainium chip's 190 BF16 and 47.5 FP32 TFLOPS over its 2 cores; no LNC
        (2, "torch.bfloat16", NEURON, 95 * T),
        (2, "torch.float16", NEURON, 95 * T),
        (2, "torch.float8_e4m3fn", NEURON, 95 * T),
        (2, "torch.float32", {**NEURON, "NEURON_CC_FLAGS": "--auto-cast none"}, 23.75 * T),
        (2, "torch.bfloat16", {**NEURON, "NEURON_LOGICAL_NC_CONFIG": "2"}, 95 * T),
        (2, "torch.bfloat16", {**NEURON, "NEURON_RT_VISIBLE_CORES": "0-3"}, 4 * 95 * T),
        (2, "torch.bfloat16", {**NEURON, "NEURON_RT_NUM_CORES": "2"}, 2 * 95 * T),
        # NeuronCore-v3: a Trainium2 chip's 667 BF16, 1299 FP8, 181 FP32 TFLOPS over 8; LNC 2 unless set to 1
        (3, "torch.bfloat16", NEURON, 2 * 667 / 8 * T),
        (3, "torch.bfloat16", {**NEURON, "NEURON_LOGICAL_NC_CONFIG": "1"}, 667 / 8 * T),
        (3, "torch.float8_e5m2", NEURON, 2 * 1299 / 8 * T),
        (3, "torch.float32", NEURON, 2 * 181 / 8 * T),
        (3, "torch.bfloat16", {**NEURON, "NEURON_RT_VISIBLE_CORES": "0,2"}, 2 * 2 * 667 / 8 * T),
        # NeuronCore-v4: a Trainium3 chip's 671 BF16, 2517 FP8 TFLOPS over 8
        (4, "torch.bfloat16", {**NEURON, "NEURON_LOGICAL_NC_CONFIG": "1"}, 671 / 8 * T),
        (4, "torch.float8_e4m3fn", NEURON, 2 * 2517 / 8 * T),
    ],
)
def test_the_peak_of_a_rank(version, dtype, env, peak):
    assert table_peak(version, dtype, "xla", env) == pytest.approx(peak)


@pytest.mark.parametrize(
    ("version", "dtype", "device", "env"),
    [
        (None, "torch.bfloat16", "xla", NEURON),  # no Neuron device: the CPU
        (1, "torch.bfloat16", "xla", NEURON),  # Inferentia's NeuronCore-v1: not in the tables
        (2, "torch.float64", "xla", NEURON),  # no figure for it
        (2, "torch.bfloat16", "cpu", NEURON),  # trains on the host of a Trainium machine
        (2, "torch.bfloat16", "cuda", NEURON),
        (2, "torch.bfloat16", "xla", {"PJRT_DEVICE": "CPU"}),  # torch_xla on its CPU device
    ],
)
def test_no_peak_where_the_tables_have_none(version, dtype, device, env):
    assert table_peak(version, dtype, device, env) is None


def test_torchneurons_device_and_an_unset_pjrt_device_are_neuron():
    assert table_peak(2, "torch.bfloat16", "neuron", {}) == pytest.approx(95 * T)
    assert table_peak(2, "torch.bfloat16", "xla", {}) == pytest.approx(95 * T)


@pytest.mark.parametrize(
    ("flags", "cast"),
    [
        ("", None),  # the compiler's default since Neuron 2.27: none
        ("--auto-cast none", None),
        ("--auto-cast matmult", "bf16"),
        ("--auto-cast=all --auto-cast-type=fp16", "fp16"),
        ("--auto-cast-type tf32 --auto-cast matmult", "tf32"),
        ("--auto-cast=matmult --auto-cast-type fp8_e4m3", "fp8"),
        ("--auto-cast matmult --model-type=transformer --auto-cast none", None),  # the right-most wins
        ("--auto-cast matmult --auto-cast-type int8", None),  # not a type it casts to
        ("--auto-cast", None),
    ],
)
def test_what_neuronx_cc_casts_fp32_matrix_multiplications_to(flags, cast):
    assert auto_cast(flags) == cast


def test_fp32_on_an_xla_device_is_what_the_compiler_makes_of_it():
    cast = {"NEURON_CC_FLAGS": "--auto-cast matmult"}
    assert data_type("torch.float32", "xla", cast) == "bf16"
    assert data_type("torch.float32", "xla", {}) == "fp32"
    assert data_type("torch.float32", "neuron", cast) == "fp32"  # TorchNeuron's eager kernels: no such flag
    assert data_type("torch.bfloat16", "xla", cast) == "bf16"
    assert table_peak(2, "torch.float32", "xla", {**NEURON, **cast}) == pytest.approx(95 * T)


def test_a_ranks_neuroncores():
    assert rank_cores({}) == 1
    assert rank_cores({"NEURON_RT_VISIBLE_CORES": "4-7"}) == 4
    assert rank_cores({"NEURON_RT_VISIBLE_CORES": "0,2,4-5", "NEURON_RT_NUM_CORES": "8"}) == 4
    assert rank_cores({"NEURON_RT_NUM_CORES": "8"}) == 8
    assert rank_cores({"NEURON_RT_NUM_CORES": "lots"}) == 1
    assert rank_cores({"NEURON_RT_NUM_CORES": "0"}) == 1


def sysfs(root: Path, device: int = 0, core_arch: str | None = None, device_name: str | None = None) -> Path:
    """The driver's files for one Neuron device under ``root``."""
    base = root / f"neuron{device}"
    (base / "neuron_core0" / "info" / "architecture").mkdir(parents=True, exist_ok=True)
    (base / "info" / "architecture").mkdir(parents=True, exist_ok=True)
    if core_arch is not None:
        (base / "neuron_core0" / "info" / "architecture" / "arch_type").write_text(core_arch + "\n")
    if device_name is not None:
        (base / "info" / "architecture" / "device_name").write_text(device_name + "\n")
    return root


@pytest.mark.parametrize(
    ("core_arch", "device_name", "version"),
    [
        ("NCv2", None, 2),
        ("NCv3", None, 3),
        ("NCv3d", None, 3),
        ("NC_V3d", None, 3),
        ("ncv4", None, 4),
        (None, "Trainium2", 3),
        (None, "trainium", 2),
        (None, "Inferentia2", 2),
        ("NCv9", None, None),  # a generation the tables do not have
        ("NCv1", "Inferentia", None),
        (None, None, None),
        ("garbage" * 50, "garbage", None),
    ],
)
def test_the_generation_from_the_drivers_sysfs(tmp_path, core_arch, device_name, version):
    assert neuroncore_version(sysfs(tmp_path, 0, core_arch, device_name)) == version


def test_no_driver_no_generation(tmp_path):
    assert neuroncore_version(tmp_path / "absent") is None
    assert neuroncore_version(tmp_path) is None  # the directory, without devices
    (tmp_path / "neuron0").write_text("not a directory")
    assert neuroncore_version(tmp_path) is None


def test_the_first_devices_that_say_are_read_in_their_order(tmp_path):
    sysfs(tmp_path, 10, "NCv2")
    sysfs(tmp_path, 2, "NCv3")
    assert neuroncore_version(tmp_path) == 3
