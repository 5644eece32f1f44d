"""``training_samples_total`` and ``training_tokens_total`` against the batches a training loop counts itself
(``tests/scripts/throughput_train.py``), on the CPU, inductor and torch_xla: Hugging Face-style dict batches padded
to their longest sequence with a shorter last batch, gradient accumulation, evaluation under ``no_grad`` (not
counted), ``batch_size=None``, iterable datasets with and without workers, tuples, a loader inside a loader,
``MpDeviceLoader``, a torchvision model; and ``training_peak_flops``, absent on the CPU unless the option sets it."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest

from tests.support.paths import SCRIPTS
from tests.support.processes import run_python, xla_env

pytestmark = pytest.mark.training

HAS_XLA = importlib.util.find_spec("torch_xla") is not None
HAS_TORCHVISION = importlib.util.find_spec("torchvision") is not None
PEAK = 2.5e14


def run(backend: str, **env: str) -> dict:
    done = run_python(SCRIPTS / "throughput_train.py", backend, env=xla_env(**env), timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def assert_exact(result: dict, cases: set[str]) -> None:
    assert cases <= set(result["cases"]), result
    for name, counts in result["cases"].items():
        assert counts["exported"] == counts["expected"], (name, counts)
    assert result["errors"] == 0


def test_the_cpu_counts_every_kind_of_loader_exactly_and_serves_no_peak():
    result = run("eager")
    cases = {"dict", "accumulation", "batch_size_none", "iterable_batches", "iterable_workers", "tuples", "nested"}
    assert_exact(result, cases | ({"vision"} if HAS_TORCHVISION else set()))
    assert result["cases"]["dict"]["expected"] == [22, 216]  # 22 sequences of 8 and 12 tokens, padded
    if HAS_TORCHVISION:
        assert result["cases"]["vision"]["expected"] == [10, 0]  # images: samples, no tokens
    assert result["peak"] is None  # no NeuronCore, no option


@pytest.mark.compile
def test_torch_compile_counts_exactly_and_serves_the_peak_the_option_sets():
    if sys.platform != "linux":
        pytest.skip("inductor needs a C compiler")
    result = run("inductor", NEURON_EXPORTER_PEAK_FLOPS=str(PEAK))
    assert_exact(result, {"dict", "accumulation"})
    assert result["peak"] == PEAK


@pytest.mark.skipif(not HAS_XLA, reason="torch_xla is not installed")
def test_mp_device_loader_batches_count_once_on_the_training_thread():
    """Its own thread iterates the DataLoader; the training thread takes the batches, on the device, from it."""
    result = run("xla")
    assert_exact(result, {"dict", "accumulation"})
    assert result["peak"] is None  # torch_xla on its CPU device
    assert result["untouched"] is True  # no graph run or compiled, no transfer: only shapes were read
