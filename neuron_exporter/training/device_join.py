"""The rank beside the device layer: the series that join its run and rank to neuron-monitor's series of its process
and NeuronCores (and to Neuron Observer's, through ``neuron_exporter_rank_info``'s node).

- ``neuron_exporter_process_info{instance_id, runtime_tag, pid}``: joins neuron-monitor's per-process series on
  ``(instance_id, runtime_tag)`` (``process_tag``);
- ``neuron_exporter_neuroncore_info{instance_id, runtime_tag, neuroncore, logical_nc_config}``: one per NeuronCore of
  ``NEURON_RT_VISIBLE_CORES`` (``neuroncores``), joins per-core series on ``(instance_id, neuroncore)``.

Both are served once the instance id is known or known to be absent (``instance_id``: its lookup runs on a thread
of its own), so they never change labels under a scrape, and no more after ``detach()``: the runtime ends with the
process, and a finished rank that the node endpoint keeps serving must not hold its cores for the next process. The
variables are read at every scrape, where a launcher may set them after ``attach()``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from prometheus_client.core import Metric

from .. import catalogue
from ..metric_family import labelled_family
from .instance_id import InstanceIdLookup
from .neuroncores import logical_config, visible_cores
from .process_tag import runtime_tag


class DeviceJoin:
    def __init__(self, instance_id: InstanceIdLookup):
        self.instance_id = instance_id
        self.stopped = False

    def collect(self, labels: dict[str, str]) -> Iterator[Metric]:
        if self.stopped or not self.instance_id.done:
            return
        instance_id = self.instance_id.value or ""
        tag = runtime_tag(os.environ)
        process = ((instance_id, tag, str(os.getpid())), 1)
        yield labelled_family(catalogue.PROCESS_INFO, labels, [process])
        cores = visible_cores(os.environ)
        if cores:
            config = logical_config(os.environ)
            yield labelled_family(
                catalogue.NEURONCORE_INFO, labels, [((instance_id, tag, str(core), config), 1) for core in cores]
            )
