"""Zero code in every import order on TorchNeuron: a script that starts with ``import torch_neuronx`` (which imports
torch from inside its own ``__init__``, where autostart attaches), with torch, or with dynamo, is measured from its
first step, under NEURON_EXPORTER_AUTO and under ``neuron-exporter run`` (the emulated ``torch_neuronx`` of
tests/support/torchneuron)."""

from __future__ import annotations

import sys

import pytest

from tests.support.daemon import free_port
from tests.support.exposition import total, value
from tests.support.paths import ROOT, SCRIPTS
from tests.support.rank_files import spooled_exposition
from tests.support.torchneuron import STANDIN, emulation_problem

pytestmark = [
    pytest.mark.training,
    pytest.mark.neuron,
    pytest.mark.skipif(emulation_problem() is not None, reason=str(emulation_problem())),
]

STEPS = 3
ORDERS = [["torch_neuronx"], ["torch", "torch_neuronx"], ["torch._dynamo", "torch_neuronx"]]
PYTHONPATH = f"{ROOT}:{STANDIN}"


def assert_every_step_counted(exposition: str) -> None:
    assert value(exposition, "training_steps_total") == STEPS
    assert value(exposition, "neuron_exporter_source_started", source="neuron") == 1
    assert total(exposition, "torchneuron_host_reads_total") == STEPS  # one loss.item() a step
    assert not [line for line in exposition.splitlines() if line.startswith("xla_")]


@pytest.mark.parametrize("modules", ORDERS, ids=["+".join(order) for order in ORDERS])
def test_autostart_counts_every_step_whatever_is_imported_first(tmp_path, modules):
    script = [sys.executable, str(SCRIPTS / "neuron_import_order.py"), str(STEPS), *modules]
    exposition = spooled_exposition(tmp_path, script, NEURON_EXPORTER_AUTO="1", PYTHONPATH=PYTHONPATH)
    assert_every_step_counted(exposition)


def test_run_counts_every_step_of_a_script_that_imports_torch_neuronx_first(tmp_path):
    command = [sys.executable, "-m", "neuron_exporter", "run", "--addr", "127.0.0.1", "--port", str(free_port())]
    command += ["--spool-dir", str(tmp_path / "spool"), "--", sys.executable, str(SCRIPTS / "neuron_import_order.py")]
    exposition = spooled_exposition(tmp_path, [*command, str(STEPS), "torch_neuronx"], PYTHONPATH=PYTHONPATH)
    assert_every_step_counted(exposition)
