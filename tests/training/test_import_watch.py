"""``import_watch.after_import``: a function runs once its module's code has run to the end, whoever imports what
first. Each case is a fresh interpreter with small packages made for it: ``outer`` imports ``inner`` half-way
through its own code, and the watcher of ``inner`` asks for ``outer`` (as autostart, run by ``import torch`` inside
``torch_xla/__init__``, asks for torch_xla)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support.paths import ROOT

WATCH = f"""
import sys
sys.path[:0] = [{str(ROOT)!r}, PACKAGES]
from neuron_exporter.training import import_watch
def whole():
    print("outer whole:", getattr(sys.modules["outer"], "END", False), flush=True)
def on_inner():
    import_watch.after_import("outer", whole)
import_watch.after_import("inner", on_inner)
"""


def run(tmp_path, outer: str, script: str) -> list[str]:
    packages = tmp_path / "packages"
    (packages / "outer").mkdir(parents=True)
    (packages / "outer" / "__init__.py").write_text(outer)
    (packages / "inner.py").write_text("")
    (packages / "other.py").write_text("")
    code = f"PACKAGES = {str(packages)!r}\n" + WATCH + script
    result = subprocess.run(
        [sys.executable, "-c", code], env={"PATH": os.environ["PATH"]}, capture_output=True, text=True, timeout=60
    )
    return [*result.stdout.splitlines(), *result.stderr.splitlines()[-1:]]


def test_a_module_half_imported_is_waited_for_to_its_end(tmp_path):
    outer = "import inner\nprint('outer goes on', flush=True)\nEND = True\n"
    script = "import outer\nprint('import returned', flush=True)\n"
    assert run(tmp_path, outer, script) == ["outer goes on", "outer whole: True", "import returned"]


def test_a_module_that_fails_to_import_calls_nothing(tmp_path):
    outer = "import inner\nraise ImportError('no')\n"
    script = "try:\n    import outer\nexcept ImportError:\n    print('failed', flush=True)\nimport other\n"
    assert run(tmp_path, outer, script) == ["failed"]


def test_a_module_that_replaces_itself_in_sys_modules_is_whole_at_the_end_of_its_import(tmp_path):
    outer = "import sys, types\nimport inner\nsys.modules['outer'] = types.SimpleNamespace(END=True)\n"
    script = "import outer\nprint('import returned', flush=True)\n"
    assert run(tmp_path, outer, script) == ["outer whole: True", "import returned"]


@pytest.mark.parametrize("chance", ["import other", "import_watch.poll()"])
def test_where_the_end_cannot_be_watched_the_next_chance_runs_it(tmp_path, chance):
    # As on an interpreter without the spec's mark: the next import of any module, or poll(), finds it whole.
    outer = "import inner\nEND = True\n"
    script = (
        "import_watch._call_when_the_mark_is_cleared = lambda name: False\n"
        f"import outer\nprint('import returned', flush=True)\n{chance}\nimport_watch.poll()\n"
    )
    assert run(tmp_path, outer, script) == ["import returned", "outer whole: True"]


def test_a_module_already_whole_runs_at_once(tmp_path):
    script = "import outer\nimport_watch.after_import('outer', whole)\n"
    assert run(tmp_path, "import inner\nEND = True\n", script) == ["outer whole: True", "outer whole: True"]


def test_a_look_up_of_the_spec_alone_leaves_the_functions_waiting_for_the_import(tmp_path):
    # Libraries probe for torch and torch_xla with importlib.util.find_spec before anything imports them.
    script = (
        "import importlib.util\n"
        "import_watch.after_import('other', lambda: print('other imported', flush=True))\n"
        "assert importlib.util.find_spec('other') is not None\n"
        "print('looked up', flush=True)\n"
        "import other\n"
    )
    assert run(tmp_path, "", script) == ["looked up", "other imported"]


def test_an_import_that_failed_leaves_the_functions_waiting_for_the_next_one(tmp_path):
    script = (
        "import_watch.after_import('other', lambda: print('other imported', flush=True))\n"
        "open(PACKAGES + '/other.py', 'w').write('raise ImportError(1)')\n"
        "try:\n    import other\nexcept ImportError:\n    print('failed', flush=True)\n"
        "open(PACKAGES + '/other.py', 'w').write('')\n"
        "import importlib; importlib.invalidate_caches(); sys.modules.pop('other', None)\n"
        "import other\n"
    )
    assert run(tmp_path, "", script) == ["failed", "other imported"]


def test_the_finder_after_the_watcher_is_asked_when_the_watcher_is_done(tmp_path):
    # A finder behind the watcher in sys.meta_path must see every import, also the one that empties the watcher.
    script = (
        "import importlib.machinery, importlib.util\n"
        "class Virtual:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'virtual':\n"
        "            return importlib.util.spec_from_loader(name, importlib.machinery.SourceFileLoader(\n"
        "                name, PACKAGES + '/other.py'))\n"
        "sys.meta_path.insert(1, Virtual())\n"
        "import_watch._call_when_the_mark_is_cleared = lambda name: False\n"
        "import outer\n"
        "import virtual\n"
        "print('virtual imported', flush=True)\n"
    )
    assert run(tmp_path, "import inner\nEND = True\n", script) == ["outer whole: True", "virtual imported"]


def test_a_function_that_raises_never_reaches_the_import(tmp_path):
    script = "import_watch.after_import('other', lambda: 1 / 0)\nimport other\nprint('imported', flush=True)\n"
    assert run(tmp_path, "", script) == [
        "imported",
        "neuron-exporter: after an import: ZeroDivisionError: division by zero",
    ]
