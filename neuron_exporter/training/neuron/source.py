"""The TorchNeuron source: what the native ``neuron`` device of PyTorch (torch-neuronx 2.13 / 2.14) runs on the CPU,
compiles, reads back to the host and allocates, in a process that imports ``torch_neuronx``.

Started when ``torch_neuronx`` is fully imported (``import_watch``); a process without it never loads this. What runs
on the training thread: a dict increment and a site per call of an operator TorchNeuron itself runs on the CPU
(``fallbacks``, path b: a call that is slow already, it syncs the device); a site per host read of a ``neuron``
tensor (``host_reads``); a read of the compile cache's statistics when dynamo starts and ends compiling
(``compiles``). Nothing per operator that runs on the device, and nothing that synchronizes it: the device sync of
a host read is the user's own, and the exporter never calls ``get_dynamo_metrics()`` (see ``names``).

Each name read is probed at start (``names``): what is missing or of another shape is not read, the rest is, one
log line says what, and ``neuron_exporter_torchneuron_readable{record}`` shows it.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from ...config import Options
from ..attribution import Attribution
from ..host_reads import HostReadHook
from ..self_metrics import SelfStats
from ..sites import SiteFinder, module_directory
from ..source import Source
from ..time_phases import DeviceCall, TimePhases
from .compiles import CacheWindow, GraphFallbacks
from .fallbacks import FallbackCalls
from .families import NeuronFamilies
from .names import LIBRARY, metrics_off, probe
from .names import readable as readable_records

log = logging.getLogger("neuron_exporter")
DEVICE = "neuron"


class NeuronSource(Source):
    stats: SelfStats

    def __init__(self, options: Options, stats: SelfStats, phases: Callable[[], TimePhases]):
        """``phases()``: the process's time ledger, told of the seconds TorchNeuron compiled kernels eagerly."""
        self.options = options
        self.stats = stats  # replaced in a forked child
        self.phases = phases
        self._eager_compile_ms: float | None = None  # the eager kernels' compile time, when last told
        self._stretch: DeviceCall | None = None  # the training thread's time since then: a call that may compile
        self.neuronx = sys.modules[LIBRARY]
        # TorchNeuron's own Python code copies to the host when it runs an operator on the CPU (path b, the linalg
        # fallbacks): those copies are its fallbacks, not the user's reads.
        # None for a stand-in made in memory, without a directory: every read is then taken for the user's.
        self._own_code = module_directory(self.neuronx)
        self.problems = probe()
        self.readable = readable_records(self.problems)
        self.sites = SiteFinder()
        self.attribution = Attribution()  # host reads by cause and site, as on XLA (no graph is cut: eager)
        self.fallbacks = FallbackCalls(self.sites, self.step_error)
        self.window = CacheWindow(self.cache_stats, self.step_error)
        self.graph_fallbacks = GraphFallbacks()
        self._host_reads = HostReadHook(self._host_read, self.step_error, DEVICE, phases=phases)
        self.families = NeuronFamilies(self, options.max_op_series, options.max_site_series)

    # -- life cycle ---------------------------------------------------------------------------------------
    def install(self) -> bool:
        unread = dict(self.problems)
        if "fallback_op_calls" in self.readable and not self.fallbacks.install(self.neuronx._C):
            unread["offloaded_op"] = "torch_neuronx._C._log_offloaded_op could not be wrapped"
        if "compile_cache" in self.readable and not self.window.install():
            unread["compile_windows"] = "dynamo's compile callbacks are missing: every compilation counts as eager"
        if "graph_fallbacks" in self.readable:
            self.graph_fallbacks.install()
        self._host_reads.install()
        self.readable = readable_records(unread)
        self._tell_eager_compilations()  # from here on
        if "compile_cache" in self.readable and metrics_off():
            log.warning(
                "neuron-exporter: TorchNeuron's metrics are off: its compile-cache counters may stay at 0 "
                "(set TORCH_NEURONX_METRICS_ENABLED=1 to count them)"
            )
        if unread:
            served = ", ".join(self.readable) or "nothing"
            log.warning(
                "neuron-exporter: TorchNeuron %s: %s; still counted: %s, host_reads",
                getattr(self.neuronx, "__version__", "?"),
                "; ".join(unread.values()),
                served,
            )
        return True

    def uninstall(self) -> None:
        self._tell_eager_compilations()  # those since the last optimizer step, before the ledger's end
        self.fallbacks.uninstall()
        self.window.uninstall()
        self.graph_fallbacks.uninstall()
        self._host_reads.uninstall()

    def after_fork(self, stats: SelfStats) -> None:
        self.stats = stats
        self._eager_compile_ms = self._stretch = None
        self.attribution = Attribution()
        self.fallbacks.clear()
        self.window.clear()
        self.graph_fallbacks.clear()
        self.families.clear()

    def parts(self):
        return self.families.parts()

    def on_optimizer_created(self) -> None:
        self.fallbacks.training_thread = threading.get_ident()  # the thread that waits in backward()
        self._tell_eager_compilations()

    def on_optimizer_step(self, optimizer) -> None:
        self._tell_eager_compilations()

    def _tell_eager_compilations(self) -> None:
        """The eager kernels' compile time since the last optimizer event, to the ledger: TorchNeuron compiles a
        kernel inside the operator's call, on the thread that called it (the graphs' time is dynamo's, timed there).
        One read of the cache's statistics (no device work)."""
        if "compile_cache" not in self.readable:
            return
        try:
            phases = self.phases()
            stats, graph = self.window.read()
            eager_ms = float(stats.get("total_compilation_time_ms") or 0) - graph["compile_ms"]
            told, self._eager_compile_ms = self._eager_compile_ms, eager_ms
            stretch, self._stretch = self._stretch, phases.device_call()
            if stretch is not None and told is not None:
                phases.device_call_ended(stretch, max(0.0, eager_ms - told) / 1000)
        except Exception as error:  # noqa: BLE001 (never into the training loop)
            self.step_error(error)

    # -- what a scrape reads (no device work) --------------------------------------------------------------
    def cache_stats(self) -> dict:
        return self.neuronx._C._get_compilation_cache_stats()

    def memory_stats(self) -> dict:
        import torch

        device_module: Any = torch  # torch.neuron is registered by TorchNeuron
        return device_module.neuron.memory_stats()

    def fallback_ops_seen(self) -> set[str]:
        return self.fallbacks.read_seen(self.neuronx.get_fallback_ops)

    def diagnosis(self, rank: dict) -> None:
        calls, sites = self.fallbacks.snapshot()
        ops = rank.setdefault("cpu_fallback_ops", {})
        for op, count in calls.items():
            ops[op] = ops.get(op, 0) + count
        rank.setdefault("cpu_fallback_sites", []).extend(
            {"op": op, "location": location, "frames": frames, "pass": "backward" if backward else "forward"}
            for op, location, frames, backward in sites
        )
        # A host read here cuts no graph (the device runs eagerly) but waits for the device: diagnose lists it so.
        rank.setdefault("sites", []).extend(
            {**record.as_dict(), "device_waits": dict(record.causes)} for record in self.attribution.records()
        )

    # -- the training thread ------------------------------------------------------------------------------
    def _host_read(self, original, cause: str, tensor, args, kwargs, frame):
        """A host read of a ``neuron`` tensor from ``frame``: its site, then the read (which waits for the device,
        as it would without the exporter), unless TorchNeuron's own code made it. Its exceptions are the original
        method's only."""
        if self._own_code and frame.f_code.co_filename.startswith(self._own_code):
            return original(tensor, *args, **kwargs)
        start = time.perf_counter()
        try:
            location = self.sites.site(frame)
            frames = None if location in self.attribution.sites else self.sites.frames(frame)
            self.attribution.host_read(cause, location, frames)
        except Exception as error:  # noqa: BLE001 (never into the training loop)
            self.step_error(error)
        self.stats.hook_seconds += time.perf_counter() - start
        return original(tensor, *args, **kwargs)
