"""Settings for every test (helpers live in tests/support)."""

import os

import pytest

from tests.support.paths import RUN

os.environ["NEURON_EXPORTER_RUN_ID"] = RUN
# Inductor checks which vector instructions the compiler can build for by starting a Python that imports torch for
# each one (about 8 s of CPU) in every process that compiles with it; the tests take the CPU's own flags instead.
os.environ.setdefault("TORCHINDUCTOR_VEC_ISA_OK", "1")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests that train start first: `make test` hands whole modules to its workers, and the longest ones
    started last would leave one worker running them alone at the end."""
    items.sort(
        key=lambda item: (item.get_closest_marker("compile") is None, item.get_closest_marker("training") is None)
    )
