"""NEURON_EXPORTER_AUTO at interpreter start-up, through the ``.pth`` file and the ``sitecustomize`` of
``training/autostart_path``: read as a boolean option is, left alone by ``python -I``, and cheap (a plain finder,
nothing of importlib.abc). Each case is a real interpreter that processes the real files; it starts with ``-S``, so
that the files of the environment running the tests (its own copy of the .pth) are left out, and then has ``site``
process the file under test."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys

import pytest

from neuron_exporter.config import AUTO_ENV, TRUE, auto_enabled
from neuron_exporter.node.spool_reader import read_rank_file
from tests.support.exposition import total
from tests.support.paths import ROOT

AUTOSTART_DIR = ROOT / "neuron_exporter" / "training" / "autostart_path"
PTH = AUTOSTART_DIR / "neuron_exporter_autostart.pth"
VALUES = ["1", "true", "True", "YES", " on ", "0", "false", "False", "no", "off", "OFF", "", "maybe", "2"]

# What start-up left: whether the watcher is armed, and the modules that arming it imported.
PROBE = """
import json, site, sys
import encodings.utf_8_sig  # what site reads a .pth file with from Python 3.13 on: site's import, not arming's
sys.path[:0] = {path!r}
before = set(sys.modules)
{trigger}
armed = any(type(f).__name__ == "_ImportWatcher" for f in sys.meta_path)
print(json.dumps({{"armed": armed, "modules": sorted(set(sys.modules) - before)}}))
"""


def through_pth(tmp_path, value: str | None, *flags: str) -> dict:
    """A site directory with the .pth file in it, processed by ``site`` as it does site-packages."""
    site_dir = tmp_path / "site-packages"
    site_dir.mkdir(exist_ok=True)
    shutil.copy(PTH, site_dir)
    return probe(PROBE.format(path=[str(ROOT)], trigger=f"site.addsitedir({str(site_dir)!r})"), value, ("-S", *flags))


def through_sitecustomize(value: str | None) -> dict:
    """``PYTHONPATH`` as ``neuron-exporter run`` sets it, and the sitecustomize found there run."""
    return probe(PROBE.format(path=[str(AUTOSTART_DIR), str(ROOT)], trigger="import sitecustomize"), value, ("-S",))


def probe(code: str, value: str | None, flags) -> dict:
    environment = {"PATH": os.environ["PATH"], **({AUTO_ENV: value} if value is not None else {})}
    result = subprocess.run(
        [sys.executable, *flags, "-c", code], env=environment, capture_output=True, text=True, timeout=60, cwd="/"
    )
    assert result.returncode == 0 and result.stderr == "", result.stderr
    return json.loads(result.stdout)


def test_sitecustomize_reads_true_as_the_package_does():
    """It reads the variable before it knows whether this Python can import the package, so it has its own copy."""
    tree = ast.parse((AUTOSTART_DIR / "sitecustomize.py").read_text())
    copies = [node.value for node in tree.body if isinstance(node, ast.Assign) and node.targets[0].id == "TRUE"]
    assert [ast.literal_eval(copy) for copy in copies] == [TRUE]


@pytest.mark.parametrize("value", VALUES)
def test_the_variable_is_read_as_a_boolean_option_is(tmp_path, value):
    expected = value.strip().lower() in ("1", "true", "yes", "on")
    assert auto_enabled({AUTO_ENV: value}) is expected
    assert through_pth(tmp_path, value)["armed"] is expected
    assert through_sitecustomize(value)["armed"] is expected


def test_unset_arms_nothing(tmp_path):
    assert not through_pth(tmp_path, None)["armed"] and not through_sitecustomize(None)["armed"]


def test_python_dash_i_is_left_alone(tmp_path):
    assert through_pth(tmp_path, "1", "-I") == {"armed": False, "modules": []}


def test_arming_imports_four_small_modules_and_nothing_of_importlib(tmp_path):
    found = through_pth(tmp_path, "1")
    assert found["armed"]
    assert found["modules"] == [
        "neuron_exporter",
        "neuron_exporter.training",
        "neuron_exporter.training.autostart",
        "neuron_exporter.training.import_watch",
    ]


def test_the_plain_finder_attaches_after_the_watched_import(tmp_path):
    package = tmp_path / "packages" / "torch"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("print('torch imported', flush=True)\n")
    code = (
        f"import sys; sys.path[:0] = [{str(ROOT)!r}, {str(tmp_path / 'packages')!r}]\n"
        "from neuron_exporter.training import autostart\n"
        "autostart._attach = lambda: print('attached', flush=True)\n"
        "autostart.install(); autostart.install()\n"
        "import json; import torch\n"
        "print(sum(type(f).__name__ == '_ImportWatcher' for f in sys.meta_path))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], env={"PATH": os.environ["PATH"]}, capture_output=True, text=True, timeout=60
    )
    assert result.stdout.split("\n") == ["torch imported", "attached", "0", ""], result.stderr


@pytest.mark.training
def test_a_script_that_attaches_itself_under_auto_is_attached_once_and_quietly(tmp_path):
    """``neuron_exporter.attach()`` imports the attach module, which imports torch, which fires the watcher inside
    that import: it must wait for the module, not report the half-imported module as a failure."""
    code = (
        "import neuron_exporter\n"
        f"handle = neuron_exporter.attach(port=0, addr='127.0.0.1', spool_dir={str(tmp_path / 'spool')!r})\n"
        "import torch\n"
        "model = torch.nn.Linear(4, 2); optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for _ in range(3):\n"
        "    optimizer.zero_grad(); model(torch.ones(1, 4)).sum().backward(); optimizer.step()\n"
        "print(handle is neuron_exporter.attach(), flush=True)\n"
        "handle.detach()\n"
    )
    environment = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT), AUTO_ENV: "1", "PJRT_DEVICE": "CPU"}
    result = subprocess.run(
        [sys.executable, "-c", code], env=environment, capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "not attached" not in result.stderr, result.stderr[-3000:]
    assert result.stdout.split() == ["True"]
    (spooled,) = (tmp_path / "spool").glob("rank-*.prom")
    assert total(read_rank_file(spooled).exposition.decode(), "training_steps_total") == 3
