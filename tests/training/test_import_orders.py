"""Zero code in every import order: a script that starts with ``import torch_xla`` (torch is then imported from
inside torch_xla's own ``__init__``, and autostart attaches there), with one of torch_xla's submodules, with torch,
or with dynamo, is measured from its first step, under NEURON_EXPORTER_AUTO and under ``neuron-exporter run``."""

from __future__ import annotations

import sys

import pytest

from tests.support.daemon import free_port
from tests.support.exposition import value
from tests.support.paths import SCRIPTS
from tests.support.rank_files import spooled_exposition

pytestmark = pytest.mark.training

STEPS = 3
ORDERS = [
    ["torch_xla"],
    ["torch_xla.core.xla_model"],
    ["torch_xla.runtime", "torch"],
    ["torch_xla.distributed.parallel_loader"],
    ["torch", "torch_xla"],
    ["torch._dynamo", "torch_xla.core.xla_model"],
]


def assert_every_step_counted(exposition: str) -> None:
    assert value(exposition, "xla_steps_total") == STEPS
    assert value(exposition, "training_steps_total") == STEPS
    assert value(exposition, "neuron_exporter_source_started", source="xla") == 1


@pytest.mark.parametrize("modules", ORDERS, ids=["+".join(order) for order in ORDERS])
def test_autostart_counts_every_step_whatever_is_imported_first(tmp_path, modules):
    script = [sys.executable, str(SCRIPTS / "import_order.py"), str(STEPS), *modules]
    assert_every_step_counted(spooled_exposition(tmp_path, script, NEURON_EXPORTER_AUTO="1"))


@pytest.mark.parametrize("modules", [["torch_xla"], ["torch_xla.core.xla_model"]])
def test_run_counts_every_step_of_a_script_that_imports_torch_xla_first(tmp_path, modules):
    command = [sys.executable, "-m", "neuron_exporter", "run", "--addr", "127.0.0.1", "--port", str(free_port())]
    command += ["--spool-dir", str(tmp_path / "spool"), "--", sys.executable, str(SCRIPTS / "import_order.py")]
    assert_every_step_counted(spooled_exposition(tmp_path, [*command, str(STEPS), *modules]))
