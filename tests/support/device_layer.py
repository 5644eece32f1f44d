"""Stand-ins for the device layer, each a real HTTP server (``StandIn``) serving what its exporter serves.

``neuron_monitor(instance, runtimes)``: neuron-monitor's Prometheus exporter (``neuron-monitor-prometheus.py``),
with its documented names and labels for the Neuron runtimes (processes) and the instance it is given. It follows the
exporter's own code: every series has the instance's labels (``instance_name``, ``instance_id``, ``instance_type``,
``availability_zone``, ``region``, ``subnet_id``); a runtime's also its ``runtime_tag``, and its per-core ones
``neuroncore`` (``neuroncore_memory_usage_*`` keep the ``memory_location`` the exporter leaves as ``None``);
counters add what each report counted, here at every scrape.

``observer(per_scrape)``: Neuron Observer's uncorrected ECC events of a node's devices, under the name the dashboards
expect (``neuron_exporter/mixin/device_layer.py``); the scrape configuration gives it its ``node``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

CORE_MEMORY_KINDS = ("constants", "model_code", "model_shared_scratchpad", "runtime_memory", "tensors")
ECC_EVENTS = ("mem_ecc_corrected", "mem_ecc_uncorrected", "sram_ecc_corrected", "sram_ecc_uncorrected")


@dataclass(frozen=True)
class Runtime:
    """A process's Neuron runtime as neuron-monitor reports it."""

    runtime_tag: str
    neuroncores: tuple[int, ...]
    utilization: float  # of each core, 0 to 1
    device_memory: float  # bytes
    host_memory: float
    errors: dict[str, float] = field(default_factory=dict)  # error_type -> errors counted per scrape


@dataclass(frozen=True)
class Instance:
    instance_id: str
    ecc_per_scrape: dict[str, float] = field(default_factory=dict)  # event_type -> events of device 0 per scrape

    def labels(self) -> dict[str, str]:
        return {
            "instance_name": "",
            "instance_id": self.instance_id,
            "instance_type": "trn2.48xlarge",
            "availability_zone": "us-east-2b",
            "region": "us-east-2",
            "subnet_id": "subnet-0123456789abcdef0",
        }


def _family(kind, name: str, help_text: str, labels: dict[str, str], *own: str) -> Metric:
    return kind(name, help_text, labels=[*labels, *own])


class NeuronMonitorCollector:
    def __init__(self, instance: Instance, runtimes: list[Runtime]):
        self.instance = instance
        self.runtimes = runtimes
        self.scrapes = 0
        self._lock = threading.Lock()

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            self.scrapes += 1
            scrapes = self.scrapes
        base = self.instance.labels()
        info = GaugeMetricFamily("instance_info", "EC2 instance information", labels=list(base))
        info.add_metric(list(base.values()), 1)
        yield info
        for runtime in self.runtimes:
            yield from self._runtime(base, runtime, scrapes)
        ecc = _family(
            CounterMetricFamily,
            "hardware_ecc_events",
            "Hardware ecc events total",
            base,
            "event_type",
            "neuron_device_index",
        )
        for event in ECC_EVENTS:
            ecc.add_metric([*base.values(), event, "0"], scrapes * self.instance.ecc_per_scrape.get(event, 0))
        yield ecc

    def _runtime(self, base: dict[str, str], runtime: Runtime, scrapes: int) -> Iterator[Metric]:
        labels = {**base, "runtime_tag": runtime.runtime_tag}
        values = list(labels.values())
        utilization = _family(
            GaugeMetricFamily, "neuroncore_utilization_ratio", "NeuronCore utilization ratio", labels, "neuroncore"
        )
        for core in runtime.neuroncores:
            utilization.add_metric([*values, str(core)], runtime.utilization)
        yield utilization
        memory = _family(
            GaugeMetricFamily,
            "neuron_runtime_memory_used_bytes",
            "Runtime memory used bytes",
            labels,
            "memory_location",
        )
        memory.add_metric([*values, "host"], runtime.host_memory)
        memory.add_metric([*values, "neuron_device"], runtime.device_memory)
        yield memory
        for kind in CORE_MEMORY_KINDS:
            usage = _family(
                GaugeMetricFamily,
                f"neuroncore_memory_usage_{kind}",
                f"NeuronCore memory utilization for {kind}",
                labels,
                "neuroncore",
                "memory_location",
            )
            for core in runtime.neuroncores:
                usage.add_metric([*values, str(core), "None"], runtime.device_memory / 10)
            yield usage
        errors = _family(CounterMetricFamily, "execution_errors", "Execution errors total", labels, "error_type")
        for error_type, per_scrape in runtime.errors.items():
            errors.add_metric([*values, error_type], scrapes * per_scrape)
        yield errors
        status = _family(CounterMetricFamily, "execution_status", "Execution status total", labels, "status_type")
        status.add_metric([*values, "completed"], scrapes * 10)
        yield status
        latency = _family(
            GaugeMetricFamily, "execution_latency_seconds", "Execution latency in seconds", labels, "percentile"
        )
        for percentile, seconds in (("p50", 0.01), ("p99", 0.02)):
            latency.add_metric([*values, percentile], seconds)
        yield latency


class ObserverCollector:
    def __init__(self, ecc_uncorrected_per_scrape: float):
        self.per_scrape = ecc_uncorrected_per_scrape
        self.scrapes = 0

    def collect(self) -> Iterator[Metric]:
        self.scrapes += 1
        ecc = CounterMetricFamily(
            "neuron_device_mem_ecc_uncorrected", "Uncorrected memory ECC events", labels=["neuron_device"]
        )
        ecc.add_metric(["0"], self.scrapes * self.per_scrape)
        yield ecc


class StandIn:
    """``with StandIn(collector) as server:`` serves the collector on ``server.url`` (``/metrics``)."""

    def __init__(self, collector):
        self.collector = collector
        registry = CollectorRegistry(auto_describe=False)
        registry.register(collector)

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = generate_latest(registry)
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.target = f"127.0.0.1:{self.server.server_address[1]}"
        self.url = f"http://{self.target}/metrics"

    def __enter__(self) -> StandIn:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def neuron_monitor(instance: Instance, runtimes: list[Runtime]) -> StandIn:
    return StandIn(NeuronMonitorCollector(instance, runtimes))


def observer(ecc_uncorrected_per_scrape: float) -> StandIn:
    return StandIn(ObserverCollector(ecc_uncorrected_per_scrape))
