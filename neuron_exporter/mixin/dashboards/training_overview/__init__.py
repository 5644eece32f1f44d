"""The "Training overview" dashboard: is each run stepping, how fast, which lines cut or recompile its graphs,
where does the step time go, and is the exporter healthy.

This module assembles the dashboard; each row is a module of its own, whose ``row(board, c, q)`` adds the row and
its panels. A new row is one new module and its line in ``ROWS`` (with its name in the import above it)."""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard
from grafana_foundation_sdk.models import dashboard as model

from ...config import DEFAULTS, Config
from ..panels import Queries, dashboard_links, finish, variables
from . import compile_execute, device, goodput, health, host_reads, run_health, runs, summary, throughput, where

UID = "neuron-exporter-training"

# The rows, top to bottom.
ROWS = (
    summary.row,
    goodput.row,
    runs.row,
    where.row,
    run_health.row,
    device.row,
    throughput.row,
    compile_execute.row,
    host_reads.row,
    health.row,
)


def build(c: Config = DEFAULTS) -> model.Dashboard:
    """The dashboard for configuration ``c`` (its selector, and the alert thresholds drawn on its panels)."""
    q = Queries(c)
    board = (
        Dashboard("neuron-exporter / Training overview")
        .uid(UID)
        .description(
            "PyTorch/XLA training seen through neuron-exporter, per run: goodput and where the rest of the time goes, "
            "throughput, step time, "
            "graph cuts and recompilations with their top sites, compile vs execute, host reads, "
            "CPU-fallback operators, each rank's NeuronCores in neuron-monitor, and exporter health."
        )
        .tags(["neuron-exporter", "pytorch-xla"])
        .time("now-1h", "now")
        .refresh("30s")
        .tooltip(model.DashboardCursorSync.CROSSHAIR)
        .links(dashboard_links())
    )
    board = variables(board, q, with_device=True)
    for row in ROWS:
        board = row(board, c, q)
    return finish(board)
