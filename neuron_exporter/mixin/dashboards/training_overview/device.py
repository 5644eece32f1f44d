"""The "Devices" row: each rank's NeuronCores and process as the device layer sees them (neuron-monitor's utilisation,
runtime memory and execution errors, ECC events of its instance; Neuron Observer's of its node), by run and rank,
next to its goodput. The TorchNeuron dashboard has it too.

The device layer's series are joined to the rank's own: per NeuronCore on ``(instance_id, neuroncore)``, per process
on ``(instance_id, runtime_tag)``, per instance on ``instance_id``, per Kubernetes node on ``node``. The rank's side
keeps one series per key (the same rank scraped twice is one), only ranks with an instance id, and no dead rank,
whose last values the node endpoint serves for an hour and whose cores or process id a new process may have. Where
no device exporter is scraped, the panels are empty.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard, Row

from ....catalogue import NEURONCORE_INFO, PROCESS_INFO, RANK_INFO, RANK_STATE
from ... import device_layer as dev
from ...config import Config
from ..panels import RANK_LEGEND, Queries, graph, merged_table
from .goodput import time_share

BY_RANK = "run_id, rank"


def of_ranks(q: Queries, info: str, keys: str, matcher: str = 'instance_id!=""') -> str:
    """The rank's side of a join: one series per ``keys`` (with its run and rank) of ``info``, live ranks only."""
    return (
        f"(max by ({keys}, {BY_RANK}) ({info}{{{q.rank}, {matcher}}})"
        f' unless on ({BY_RANK}) ({RANK_STATE.name}{{{q.rank}, state="dead"}} == 1))'
    )


def per_core(q: Queries, metric: str) -> str:
    """``metric``'s series of the selected ranks' NeuronCores, with their run and rank."""
    cores = of_ranks(q, NEURONCORE_INFO.name, "instance_id, neuroncore")
    return f"{metric}{{{q.device}}} * on (instance_id, neuroncore) group_left ({BY_RANK}) {cores}"


def per_process(q: Queries, series: str) -> str:
    """``series`` (a selector or a range function of one) of the selected ranks' processes, with run and rank."""
    processes = of_ranks(q, PROCESS_INFO.name, "instance_id, runtime_tag")
    return f"{series} * on (instance_id, runtime_tag) group_left ({BY_RANK}) {processes}"


def ecc_per_minute(q: Queries, events: str) -> str:
    """ECC events (``events``: a matcher of their type) per minute on each selected rank's instance."""
    instances = of_ranks(q, PROCESS_INFO.name, "instance_id")
    rate = f"rate({dev.ECC_EVENTS}{{{q.device}, {events}}}[$__rate_interval])"
    return f"sum by ({BY_RANK}) ({instances} * on (instance_id) group_left () sum by (instance_id) ({rate})) * 60"


def observer_ecc_per_minute(q: Queries) -> str:
    """Neuron Observer's uncorrected ECC events per minute on each selected rank's Kubernetes node."""
    nodes = of_ranks(q, RANK_INFO.name, "node", 'node!=""')
    rate = f'rate({{__name__=~"{dev.OBSERVER_ECC_UNCORRECTED}", {q.device}}}[$__rate_interval])'
    return f"sum by ({BY_RANK}) ({nodes} * on (node) group_left () sum by (node) ({rate})) * 60"


def utilisation(q: Queries) -> str:
    return f"avg by ({BY_RANK}) ({per_core(q, dev.NEURONCORE_UTILIZATION)})"


def row(board: Dashboard, c: Config, q: Queries) -> Dashboard:
    errors = f"rate({dev.EXECUTION_ERRORS}{{{q.device}}}[$__rate_interval])"
    in_range = f"increase({dev.EXECUTION_ERRORS}{{{q.device}}}[$__range])"
    uncorrected = f"rate({dev.ECC_EVENTS}{{{q.device}, {dev.ECC_UNCORRECTED}}}[$__range])"
    return (
        board.with_row(Row("Devices: each rank's NeuronCores (neuron-monitor, Neuron Observer)"))
        .with_panel(
            graph(
                "NeuronCore utilisation and goodput by rank",
                "Each rank's NeuronCores busy (neuron-monitor's utilisation, averaged over the cores of "
                "NEURON_RT_VISIBLE_CORES), beside its goodput (the training thread's time in steps). Busy cores "
                "with a low goodput: the device works on something else than steps (compiling, host reads); idle "
                "cores with a high goodput: the steps do not keep the device busy. Empty without neuron-monitor.",
                "percentunit",
                (utilisation(q), "NeuronCores " + RANK_LEGEND),
                (time_share(q, BY_RANK, 'phase="step"'), "goodput " + RANK_LEGEND),
            )
        )
        .with_panel(
            merged_table(
                "Ranks and their NeuronCores",
                "Each selected rank's NeuronCores (NEURON_RT_VISIBLE_CORES), their utilisation now, its goodput and "
                "execution errors over the time range, and the uncorrected ECC events of its instance (per minute "
                "over the range).",
                "short",
                {"run_id": "Run", "rank": "Rank"},
                (
                    f"count by ({BY_RANK}) ({of_ranks(q, NEURONCORE_INFO.name, 'instance_id, neuroncore')})",
                    "NeuronCores",
                    None,
                ),
                (utilisation(q), "Utilisation", "percentunit"),
                (time_share(q, BY_RANK, 'phase="step"', "$__range"), "Goodput", "percentunit"),
                (f"sum by ({BY_RANK}) ({per_process(q, in_range)})", "Execution errors", None),
                (
                    f"sum by ({BY_RANK}) ({of_ranks(q, PROCESS_INFO.name, 'instance_id')} * on (instance_id) "
                    f"group_left () sum by (instance_id) ({uncorrected})) * 60",
                    "Uncorrected ECC per minute",
                    None,
                ),
            )
        )
        .with_panel(
            graph(
                "Neuron runtime memory by rank",
                "Memory the Neuron runtime of each rank's process uses, on the device and on the host "
                "(neuron-monitor, per process).",
                "bytes",
                (
                    f"sum by ({BY_RANK}, memory_location) ({per_process(q, f'{dev.RUNTIME_MEMORY}{{{q.device}}}')})",
                    "{{memory_location}} " + RANK_LEGEND,
                ),
                width=8,
            )
        )
        .with_panel(
            graph(
                "Execution errors per minute by rank",
                "Executions on each rank's NeuronCores that failed, by neuron-monitor's error type (per process).",
                "short",
                (f"sum by ({BY_RANK}, error_type) ({per_process(q, errors)}) * 60", "{{error_type}} " + RANK_LEGEND),
                width=8,
            )
        )
        .with_panel(
            graph(
                "ECC events per minute on each rank's machine",
                "Memory and SRAM ECC events of the Neuron devices of each rank's instance (neuron-monitor counts "
                "them per device, for the whole instance), corrected and uncorrected; and Neuron Observer's "
                "uncorrected ones on its Kubernetes node. An uncorrected event can fail the steps that run on "
                "that device.",
                "short",
                (ecc_per_minute(q, dev.ECC_UNCORRECTED), "uncorrected " + RANK_LEGEND),
                (ecc_per_minute(q, dev.ECC_CORRECTED), "corrected " + RANK_LEGEND),
                (observer_ecc_per_minute(q), "uncorrected (Observer) " + RANK_LEGEND),
                width=8,
            )
        )
    )
