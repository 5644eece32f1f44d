"""``attach()``: one line in a training script (or none, with ``neuron-exporter run``) turns every training step of
a PyTorch process into Prometheus metrics.

The handle keeps the list of sources (``SOURCES``) and runs their life cycle (``source``); each starts with the
library it reads, so a process without torch_xla never loads it:
- ``training_steps`` (``steps/``): every ``torch.optim`` optimizer step (``OptimizerHook``), whatever runs the model;
- ``time_phases`` (``phases/``): where the training thread's time goes, with the ledger the other sources feed;
- ``throughput`` (``throughput/``): the samples and tokens of the batches the training thread takes, and the peak of
  its devices;
- ``torch_compile`` (``torch_compile/``): dynamo's records, once ``torch._dynamo`` is imported;
- ``xla`` (``xla/``): torch_xla's step markers, host reads and fallbacks, once torch_xla is imported;
- ``neuron`` (``neuron/``): TorchNeuron's CPU fallbacks, compile cache, host reads and memory, once torch_neuronx is
  imported;
- the process and the exporter itself (``RankCollector``), and the series that join the rank to its devices in
  neuron-monitor's and Neuron Observer's series (``device_join``).
What runs where:
- on the training thread: the sources' hooks (see each module);
- on the spool thread, every ``spool_interval_seconds``: this rank's exposition written to the spool directory,
  where the node endpoint picks it up; and, when this process started the job's node endpoint (a process of its own,
  ``endpoint_keeper``), the answers to its questions: this rank's own exposition, rendered at most twice a second;
- with ``node_view`` off, on the HTTP threads at scrape time: this rank's exposition (``RankCollector``), rendered
  once for all the scrapes that wait for it, at most twice a second.
No process merges other ranks' files on its training thread's GIL.
Nothing here forces a device sync, runs a graph, or lets an exporter failure reach the training loop.

A process claims its rank (writes the spool, shows itself on the node endpoint) at its first step or compilation,
not at ``attach()``: a launcher that only starts the workers (``torch_xla.launch``, ``xmp.spawn``, ``torchrun``) or a
DataLoader worker never shadows the rank that trains. Child processes are attached too: forked ones inherit the
hooks, and ones started afresh (spawn, torchrun) attach when they import torch, through ``autostart`` and the
variables set here.
"""

from __future__ import annotations

import atexit
import json
import logging
import multiprocessing.util
import os
import sys
import time

import psutil
from prometheus_client import CollectorRegistry, generate_latest

from .. import diagnosis, fork_safe
from ..config import Options, auto_enabled, child_environment, resolve_options
from ..node.spool_writer import write_rank_file
from ..web.web_config import load_web_config
from . import AUTOSTART_DIR
from .attribution import Attribution
from .device_join import DeviceJoin
from .endpoint_keeper import EndpointKeeper
from .instance_id import InstanceIdLookup
from .neuron import SOURCE as NEURON
from .patching import Patch
from .phases import SOURCE as TIME_PHASES
from .process_tag import apply_process_tag
from .rank import rank_labels
from .rank_collector import RankCollector
from .rank_run import RankRun, process_run, read_earlier
from .self_metrics import SelfStats
from .source import Sources
from .steps import SOURCE as TRAINING_STEPS
from .steps.optimizer_hook import OptimizerHook
from .throughput import SOURCE as THROUGHPUT
from .time_phases import process_ledger
from .torch_compile import SOURCE as TORCH_COMPILE
from .xla import SOURCE as XLA

log = logging.getLogger("neuron_exporter")
# Each starts with its library (``source``).
SOURCES = (TRAINING_STEPS, TIME_PHASES, THROUGHPUT, TORCH_COMPILE, XLA, NEURON)

_lock = fork_safe.RLock()
_current: ExporterHandle | None = None
_starting = False  # attach() is importing torch, which would start the autostart attach() inside it
_children_attached = False  # this process set NEURON_EXPORTER_AUTO for its children


class ExporterHandle:
    """What ``attach()`` returns. ``port``/``url`` are None when another process holds the port (see README)."""

    def __init__(self, options: Options, registry: CollectorRegistry | None, auto: bool = False):
        self.options = options
        self.auto = auto  # started by the import of torch in a child process, not by a call in the script
        self.stats = SelfStats()
        self.collector = RankCollector(self.stats)
        self._process_start = psutil.Process().create_time()
        self.sources = Sources(SOURCES, options, self.stats, self.collector, self._process_run())
        self.device_join = DeviceJoin(InstanceIdLookup(options.instance_id, self._lookup_error))
        self.collector.add_part("device_join", self.device_join.collect)
        self._rank_registry = CollectorRegistry(auto_describe=False)
        self._rank_registry.register(self.collector)
        self._user_registry = registry
        if registry is not None:  # e.g. the registry the application already serves
            registry.register(self.collector)
        self._optimizer_hook = OptimizerHook(self._on_optimizer_created, self._on_optimizer_step, self._step_error)
        web_config = load_web_config(options.web_config_file) if options.web_config_file else None
        self._endpoint = EndpointKeeper(self, self._rank_registry, web_config)
        self._detached = False
        self._crashed = False

    def _process_run(self) -> RankRun:
        return process_run(process_ledger(self._process_start), self._process_start)

    # -- the training thread ------------------------------------------------------------------------------
    def _step_error(self, error: BaseException) -> None:
        self.stats.record_error("step", error)

    def _tag_process(self) -> None:
        if self.options.process_tag:
            try:
                apply_process_tag(rank_labels())
            except Exception as error:  # noqa: BLE001
                self.stats.record_error("step", error)

    def _lookup_error(self, error: BaseException) -> None:
        self.stats.record_error("scrape", error)  # what the scrapes serve (``device_join``) waits for it

    def _on_optimizer_created(self) -> None:
        try:
            self.sources.on_optimizer_created()
        except Exception as error:  # noqa: BLE001
            self._step_error(error)

    def _on_optimizer_step(self, optimizer, args, kwargs) -> None:
        try:
            self.sources.on_optimizer_step(optimizer)
        except Exception as error:  # noqa: BLE001
            self._step_error(error)

    @property
    def claimed(self) -> bool:
        """Whether this process has trained (made a step) or compiled, and so reports as its rank."""
        return self.last_active is not None or self.sources.has_compiled

    @property
    def last_active(self) -> float | None:
        """time.perf_counter() at the end of the last step of any source (torch_xla's may be its last marker while
        its first steps are held as possible setup)."""
        return self.sources.last_active

    # -- life cycle ---------------------------------------------------------------------------------------
    @property
    def port(self) -> int | None:
        return self._endpoint.port

    @property
    def url(self) -> str | None:
        return self._endpoint.url

    @property
    def run_id(self) -> str:
        """The run this process's series are labelled with (``run_id``): a node endpoint serves every run."""
        return rank_labels()["run_id"]

    def _start(self) -> None:
        log.setLevel(self.options.log_level.upper())
        self._tag_process()  # first: a source's start may be what starts the Neuron runtime
        self.device_join.instance_id.start()  # a thread: start-up does not wait for the metadata service
        self._optimizer_hook.install()
        self.sources.watch()
        if not self.auto:  # a child attached by autostart binds the port once it trains (in the spool thread)
            self._endpoint.serve(first_try=True)
        self._endpoint.start_spool_thread()

    def diagnosis(self) -> dict:
        """This process's diagnosis document: its own rank only (``neuron_exporter.diagnosis``)."""
        rank = Attribution().diagnosis(rank_labels(), 0, {})
        self.sources.diagnosis(rank)
        return diagnosis.fit({"format": diagnosis.FORMAT, "ranks": [rank]})  # what the node reads, no more

    def _meta(self, finished: bool = False) -> dict:
        # A hung training thread still lets the spool thread write, so liveness is judged by the last step.
        last_step = self.last_active
        last_step_time = None if last_step is None else time.time() - (time.perf_counter() - last_step)
        return {
            **rank_labels(),
            "pid": os.getpid(),
            "start_time": self._process_start,
            "finished": finished,
            "last_step_time": last_step_time,
        }

    def take_up_earlier(self) -> None:
        """Go on from the rank's earlier process in this run, if its report is in the spool directory (the spool
        thread, before this process writes its own; again if the rank's labels changed before that)."""
        run = self.sources.run
        labels = rank_labels()
        if run.wrote or run.taken_for == (labels["rank"], labels["run_id"]):
            return
        earlier = None
        if self.options.spool_dir:
            try:
                earlier = read_earlier(self.options.spool_dir, labels)
            except (OSError, ValueError) as error:  # one that cannot be read is not gone on from, and says why
                self.stats.record_error("spool", error)
        run.take_up(labels, earlier)

    def _write_spool(self, finished: bool = False) -> None:
        if not self.options.spool_dir or not self.claimed:
            return  # a process that has not trained (a launcher, a DataLoader worker) reports no rank
        try:
            run = self.sources.run
            self.take_up_earlier()
            run.sample()
            exposition = generate_latest(self._rank_registry)
            own, steps = self.sources.phases.progress()  # after the exposition: what it counted, or less
            meta = {**self._meta(finished), "history": run.history(own, steps)}
            write_rank_file(
                self.options.spool_dir,
                meta,
                exposition,
                self.options.spool_mode,
                json.dumps(self.diagnosis()).encode(),
            )
            run.wrote = True
        except Exception as error:  # noqa: BLE001
            self.stats.record_error("spool", error)

    def detach(self) -> None:
        """Undo ``attach()``: torch_xla is left exactly as it was, the endpoint closes, a last report is spooled."""
        global _current
        with _lock:
            if self._detached:
                return
            self._detached = True
            self._optimizer_hook.uninstall()
            self.sources.stop()
            self._endpoint.stop_spool_thread()
            self.device_join.stopped = True
            # A process that dies of an uncaught exception leaves its rank to be seen dead, not finished.
            self._write_spool(finished=not self._crashed)
            self._endpoint.close()
            if self._user_registry is not None:
                self._user_registry.unregister(self.collector)
            if _current is self:
                _current = None
            atexit.unregister(self.detach)

    def _after_fork_in_child(self) -> None:
        # The child has copies of the locks and of the listening socket, but none of the threads. It keeps the hooks
        # (the training code may run there), reports through the spool once it trains, and leaves the port to the
        # parent.
        self._endpoint.close_inherited_socket()
        sources = self.stats.sources
        self.stats = SelfStats()
        self.stats.sources = dict(sources)
        self.collector.stats = self.stats
        self._process_start = psutil.Process().create_time()
        self.sources.after_fork(self.stats, self._process_run())
        # The rank's process before it is its parent, which lives on: nothing to go on from (under other labels, set
        # after the fork, the spool thread looks for that rank's earlier process).
        self.sources.run.take_up(rank_labels(), None)
        self.device_join.instance_id.after_fork_in_child()
        self._tag_process()  # the parent's tag is the parent's: a forked worker's runtime gets one of its own
        self.auto = True  # like a child started afresh: bind the port only once it trains, and quietly
        self._endpoint.start_spool_thread()

    def __enter__(self) -> ExporterHandle:
        return self

    def __exit__(self, *exc) -> None:
        self.detach()


def attach(
    port: int | None = None,
    addr: str | None = None,
    registry: CollectorRegistry | None = None,
    _auto: bool = False,
    **options,
) -> ExporterHandle:
    """Start exporting this process's training metrics (every backend; torch.compile's, torch_xla's and TorchNeuron's
    once they are imported); a second call returns the same handle.

    ``port=0`` asks for a free port (``handle.port`` tells which). ``options`` are the keys of the configuration
    table in the README (``warmup_steps``, ``spool_dir``, ...); ``NEURON_EXPORTER_*`` variables set the same keys,
    and arguments given here win. A bad option raises ``ConfigError`` (one line) before anything is hooked.
    """
    global _current, _starting
    with _lock:
        if _current is not None:
            return _current
        if _auto and _starting:  # attach() is importing torch: the autostart watcher fires inside it
            return None  # type: ignore[return-value]
        overrides = {key: value for key, value in {"port": port, "addr": addr, **options}.items() if value is not None}
        _starting = True
        try:
            # A process started with NEURON_EXPORTER_AUTO (by `neuron-exporter run`, or as the child of an attached
            # process) leaves the port to whoever serves the node until it trains, even if its script calls attach().
            auto = _auto or (auto_enabled(os.environ) and not _children_attached)
            handle = ExporterHandle(resolve_options(overrides=overrides), registry, auto=auto)
            handle._start()
        finally:
            _starting = False
        _current = handle
        atexit.register(handle.detach)  # a last report marked finished, so a clean end is not taken for a death
        # A multiprocessing child ends with os._exit, which skips atexit; it runs its finalizers, which it clears
        # after a fork (so they are registered again there).
        _detach_at_the_end_of_multiprocessing_children(handle)
        _crash_watch_patch.install()
        _attach_children(overrides)
        return handle


def _detach_at_the_end_of_multiprocessing_children(handle: ExporterHandle) -> None:
    multiprocessing.util.Finalize(None, handle.detach, exitpriority=100)
    multiprocessing.util.register_after_fork(
        handle, lambda handle: multiprocessing.util.Finalize(None, handle.detach, exitpriority=100)
    )


def _attach_children(overrides: dict) -> None:
    """Child processes started afresh (spawn, torchrun, subprocess) attach themselves when they import torch,
    with the same options: they inherit these variables, and the run's id (children are of this run)."""
    global _children_attached
    _children_attached = True
    os.environ.update(child_environment(overrides, rank_labels()["run_id"], AUTOSTART_DIR))


def _crash_watch(previous):
    def excepthook(kind, value, traceback):
        if _current is not None:
            _current._crashed = True
        previous(kind, value, traceback)

    return excepthook


def _crash_watch_failed(error: BaseException) -> None:
    if _current is not None:
        _current._step_error(error)


# Installed once per process (a forked child inherits it), and never undone: it does nothing without a handle.
_crash_watch_patch = Patch(sys, "excepthook", _crash_watch, _crash_watch_failed)


def detach() -> None:
    """Undo the last ``attach()``; nothing happens if none is active."""
    with _lock:
        if _current is not None:
            _current.detach()


def _after_fork_in_child() -> None:
    if _current is not None:
        try:
            _current._after_fork_in_child()
        except Exception as error:  # noqa: BLE001
            log.warning("neuron-exporter: could not restart in the forked process: %s", error)


os.register_at_fork(after_in_child=_after_fork_in_child)
