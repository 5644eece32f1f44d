"""The Grafana dashboards, one module each, built with grafana-foundation-sdk from the configuration in
../config.py; panels.py holds the builders they share. A new source adds its module and its line in
``DASHBOARDS``."""

from __future__ import annotations

from collections.abc import Callable

from grafana_foundation_sdk.cog.encoder import JSONEncoder

from ..config import DEFAULTS, Config
from . import fragmentation, torch_compile, torchneuron, training_overview

# File name -> the function that builds the dashboard from a configuration.
DASHBOARDS: dict[str, Callable[[Config], object]] = {
    "training-overview.json": training_overview.build,
    "fragmentation-recompiles.json": fragmentation.build,
    "torch-compile.json": torch_compile.build,
    "torchneuron.json": torchneuron.build,
}


def dashboard_json(name: str, config: Config = DEFAULTS) -> str:
    return JSONEncoder(sort_keys=True, indent=2).encode(DASHBOARDS[name](config)) + "\n"
