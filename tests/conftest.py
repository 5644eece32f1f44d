"""Settings for every test (helpers live in tests/support)."""

import os

from tests.support.paths import RUN

os.environ["NEURON_EXPORTER_RUN_ID"] = RUN
