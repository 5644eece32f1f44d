"""``training_flops_total`` of a real training loop (``tests/scripts/flops_train.py``) against the model's FLOPs from
its shapes, on every backend, with the samples and tokens exact: a token model fed Hugging Face-style dict batches
with a shorter batch now and then, and a torchvision ResNet (whose FLOPs ``FlopCounterMode`` counts on a copy, on the
CPU). Within 5%, as the counting promises; on torch_xla, with no compilation more than the same run without the
exporter (and the Hugging Face Trainer's, ``test_hf_trainer.py``)."""

from __future__ import annotations

import importlib.util
import json

import pytest

from tests.support.paths import SCRIPTS
from tests.support.processes import run_python, xla_env

pytestmark = pytest.mark.training

HAS_XLA = importlib.util.find_spec("torch_xla") is not None
HAS_TORCHVISION = importlib.util.find_spec("torchvision") is not None
TOLERANCE = 0.05


def run(*args: str, **env: str) -> dict:
    done = run_python(SCRIPTS / "flops_train.py", *args, env=xla_env(**env), timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def assert_counted(result: dict) -> None:
    assert result["errors"] == 0
    for model in ("token", "vision"):
        if model in result:
            counted = result[model]
            assert counted["flops"] == pytest.approx(counted["expected"], rel=TOLERANCE), (model, counted)
    for model in ("token", "vision"):
        if model in result:
            assert result[model]["samples"] == result[model]["expected_samples"]
    assert result["token"]["tokens"] == result["token"]["expected_tokens"]


def vision() -> tuple[str, ...]:
    return ("--vision",) if HAS_TORCHVISION else ()


def test_eager_cpu_counts_the_token_model_and_a_resnet_from_their_sampled_batches():
    assert_counted(run("eager", *vision()))


@pytest.mark.skipif(not HAS_XLA, reason="torch_xla is not installed")
def test_eager_cpu_counts_in_a_process_that_imported_torch_xla():
    """The Hugging Face Trainer imports torch_xla wherever it is installed: a model on the CPU still counts."""
    assert_counted(run("eager", "--with-torch-xla"))


@pytest.mark.compile
def test_torch_compile_counts_its_graphs_static_and_dynamic():
    assert_counted(run("inductor", *vision()))


@pytest.mark.skipif(not HAS_XLA, reason="torch_xla is not installed")
def test_torch_xla_counts_its_lazy_steps_and_compiles_nothing_more():
    result = run("xla", *vision())
    assert_counted(result)
    assert result["compilations"] == run("xla", *vision(), "--detached")["compilations"]


@pytest.mark.skipif(not HAS_XLA, reason="torch_xla is not installed")
def test_torch_xla_without_functionalization_is_not_sampled_and_compiles_nothing_more():
    """There a dispatch mode folds the step's views differently (a graph more for each batch shape): no FLOPs."""
    result = run("xla", XLA_DISABLE_FUNCTIONALIZATION="1")
    assert result["errors"] == 0 and result["token"]["flops"] == 0
    assert result["token"]["tokens"] == result["token"]["expected_tokens"]
    assert result["compilations"] == run("xla", "--detached", XLA_DISABLE_FUNCTIONALIZATION="1")["compilations"]


@pytest.mark.neuron
def test_the_emulated_torchneuron_device_counts_its_eager_work():
    from tests.support.torchneuron import emulation_problem

    problem = emulation_problem()
    if problem:
        pytest.skip(problem)
    assert_counted(run("neuron"))
