"""The site caches keep no code object alive: code that is exec'd, found as a site and dropped (generated code, as
torch.fx makes) is freed, and the caches' memory stays bounded. In a fresh interpreter, to measure it alone."""

from __future__ import annotations

import gc
import json
import subprocess
import sys

from tests.support.paths import ROOT

SITES = 20_000
# Runs SITES distinct exec'd code objects, each a site with a file name of its own, and prints how many are still
# alive afterwards, what the caches grew by (traced memory, after a collection) and the sites found.
SCRIPT = """
import gc, json, sys, tracemalloc, weakref
from neuron_exporter.training.sites import SiteFinder

finder = SiteFinder()
refs, wrong = [], []
gc.collect()
tracemalloc.start()
before = tracemalloc.get_traced_memory()[0]
for n in range({sites}):
    source = "x = " + str(n) + "\\nlocation = finder.site(sys._getframe())\\n"
    code = compile(source, "<eval_with_key>." + str(n), "exec")
    scope = {{"finder": finder, "sys": sys}}
    exec(code, scope)
    if scope["location"] != "<eval_with_key>." + str(n) + ":2":
        wrong.append(scope["location"])
    refs.append(weakref.ref(code))
    del code, scope
gc.collect()
grown = tracemalloc.get_traced_memory()[0] - before - sys.getsizeof(refs) - len(refs) * sys.getsizeof(refs[0])
# Code objects of one file name, one after another: an id freed by one is taken by the next (at another line).
for n in range(2000):
    scope = {{"finder": finder, "sys": sys}}
    exec(compile("\\n" * (n % 7) + "location = finder.site(sys._getframe())", "<string>", "exec"), scope)
    if scope["location"] != "<string>:" + str(n % 7 + 1):
        wrong.append(scope["location"])
print(json.dumps({{"alive": sum(ref() is not None for ref in refs), "grown": grown, "wrong": wrong[:5]}}))
"""


def test_20000_execd_sites_are_freed_and_cost_under_10_mib():
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(sites=SITES)], capture_output=True, text=True, cwd=ROOT, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout.splitlines()[-1])
    assert found["wrong"] == []
    assert found["alive"] == 0
    assert found["grown"] < 10 * 1024 * 1024, found


def test_a_live_site_is_cached_once_and_forgotten_when_its_code_ends():
    from neuron_exporter.training.sites import SiteFinder

    finder = SiteFinder()
    scope = {"finder": finder, "sys": sys}
    exec(compile("def where():\n    return finder.site(sys._getframe())\n", "<live>", "exec"), scope)
    code = scope["where"].__code__
    assert scope["where"]() == scope["where"]() == "<live>:2"
    (known,) = [entry for key, entry in finder._names.items() if key == id(code)]
    assert known[0]() is code and list(known[3].values()) == ["<live>:2"]
    del scope, code, known
    gc.collect()  # the function and its globals hold each other
    assert not any(entry[1] == "<live>" for entry in finder._names.values())
