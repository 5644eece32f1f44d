"""Every metric family the exporter serves, in one place: its name, type, HELP, labels and owner.

The sources, the rank's collector and the node endpoint build their families from these entries (``metric_family``
refuses one that is not here); the dashboards and rules name only series listed here, and ``docs/metrics.md`` lists
exactly these, types and labels too (both checked by the tests). A family is one entry here, its row there, its code.

``labels`` are the family's own labels (a ``per_rank`` one's come after the rank's: ``run_id``, ``rank``,
``local_rank``); ``values``, every value of a label that dashboards, rules, docs and the diagnosis name (checked
there by the tests). ``owner`` serves it: a source (its ``source`` label), ``rank`` (the rank's collector) or ``node``.
"""

from __future__ import annotations

from dataclasses import dataclass

from .label_values import CUT_CAUSES, PHASES, RANK_STATES, READ_CAUSES

COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


@dataclass(frozen=True)
class Family:
    name: str  # as served: a counter's ends in _total, a histogram's is the name of its _bucket, _sum, _count
    type: str  # COUNTER, GAUGE or HISTOGRAM
    help: str
    owner: str
    labels: tuple[str, ...] = ()
    per_rank: bool = True
    values: tuple[tuple[str, tuple[str, ...]], ...] = ()  # a label's every value, where dashboards and rules rely on it

    def values_of(self, label: str) -> tuple[str, ...]:
        return dict(self.values)[label]

    def series(self) -> tuple[str, ...]:
        """The sample names Prometheus stores for it."""
        if self.type == HISTOGRAM:
            return tuple(self.name + suffix for suffix in HISTOGRAM_SUFFIXES)
        return (self.name,)


def _counter(name: str, help: str, owner: str, *labels: str, values: dict | None = None) -> Family:
    return Family(name, COUNTER, help, owner, labels, values=tuple((values or {}).items()))


def _gauge(name: str, help: str, owner: str, *labels: str, values: dict | None = None) -> Family:
    return Family(name, GAUGE, help, owner, labels, values=tuple((values or {}).items()))


# -- torch_xla (training/xla/) -------------------------------------------------------------------------------------
XLA = "xla"
XLA_STEPS = _counter(
    "xla_steps_total",
    "Training steps: optimizer steps once the process steps a torch.optim optimizer, else step markers that ran a "
    "graph",
    XLA,
)
XLA_STEP_DURATION = Family(
    "xla_step_duration_seconds",
    HISTOGRAM,
    "Wall time from one step end to the next (a training step's first from the optimizer's creation)",
    XLA,
)
XLA_GRAPHS_PER_STEP = Family(
    "xla_graphs_per_step", HISTOGRAM, "Graphs run in a step, at step markers and cut off before them", XLA
)
XLA_FRAGMENTED_STEPS = _counter("xla_fragmented_steps_total", "Steps in which a graph was cut", XLA)
XLA_STEP_MARKERS = _counter("xla_step_markers_total", "Step markers that ran a graph (mark_step, sync, loaders)", XLA)
SYNCS = _counter("neuron_exporter_syncs_total", "Step markers seen, including empty syncs that are not steps", XLA)
WARMUP_STEPS = _gauge(
    "neuron_exporter_warmup_steps", "Steps a rank makes before its recompilations alert (XlaRecompilationStorm)", XLA
)
XLA_GRAPH_CUTS = _counter(
    "xla_graph_cuts_total",
    "Graphs run before a step marker, by cause (the host read: item, bool, print, ...; cpu_fallback; unattributed) "
    "and source line",
    XLA, "cause", "location", values={"cause": CUT_CAUSES},
)  # fmt: skip
XLA_HOST_READS = _counter(
    "xla_host_reads_total",
    "Reads of device data by the host, by cause and source line, whether or not they ran a graph",
    XLA, "cause", "location", values={"cause": READ_CAUSES},
)  # fmt: skip
XLA_NEW_GRAPHS = _counter(
    "xla_new_graphs_total",
    "First compilations of a computation (a new code path: the first step, an eval loop, a logging step), by the "
    "source line that ran it",
    XLA,
    "location",
)
XLA_RECOMPILATIONS = _counter(
    "xla_recompilations_total",
    "Compilations of a computation that compiled before, for other input shapes or Python values, by the source "
    "line that ran it",
    XLA,
    "location",
)
XLA_FALLBACK_SITES = _gauge(
    "xla_cpu_fallback_site_info",
    "Where a CPU-fallback operator was called, as the fallback_sites option's probe saw it (pass: forward, or "
    "backward for a call from the backward pass, named by the line that called backward()); always 1",
    XLA,
    "op",
    "location",
    "pass",
)
XLA_COMPILATIONS = _counter("xla_compilations_total", "Real compiler runs (UncachedCompile)", XLA)
XLA_GRAPH_CACHE_HITS = _counter(
    "xla_graph_cache_hits_total", "Graphs served from the compile cache (CachedCompile)", XLA
)
XLA_COMPILE_SECONDS = _counter("xla_compile_seconds_total", "Time spent compiling graphs (CompileTime)", XLA)
XLA_GRAPH_EXECUTIONS = _counter("xla_graph_executions_total", "Graph executions (ExecuteTime samples)", XLA)
XLA_EXECUTE_SECONDS = _counter("xla_execute_seconds_total", "Device time spent executing graphs (ExecuteTime)", XLA)
XLA_DEVICE_TO_HOST = _counter(
    "xla_device_to_host_transfers_total",
    "Reads of device data by the host: .item(), print, .cpu(), CPU fallbacks (TransferFromDeviceTime samples)",
    XLA,
)
XLA_FROM_DEVICE_SECONDS = _counter(
    "xla_transfer_from_device_seconds_total",
    "Time spent copying device data to the host (TransferFromDeviceTime)",
    XLA,
)
XLA_HOST_TO_DEVICE = _counter(
    "xla_host_to_device_transfers_total", "Uploads of host data to the device (TransferToDeviceTime samples)", XLA
)
XLA_TO_DEVICE_SECONDS = _counter(
    "xla_transfer_to_device_seconds_total", "Time spent copying host data to the device (TransferToDeviceTime)", XLA
)
XLA_HOST_SCALAR_READS = _counter(
    "xla_host_scalar_reads_total", ".item() and other scalar reads by the host (aten::_local_scalar_dense)", XLA
)
XLA_FALLBACK_OPS = _counter(
    "xla_cpu_fallback_ops_total",
    "Executions of operators with no XLA lowering, run on the CPU, by operator: every namespace::op counter "
    "(aten::, torchvision::, custom ops) but xla:: and aten::_local_scalar_dense (.item())",
    XLA,
    "op",
)
XLA_LOWERED_OPS = _counter("xla_lowered_ops_total", "Operators lowered to XLA (xla:: counters), by operator", XLA, "op")
XLA_EVENTS = _counter("xla_events_total", "Every other torch_xla counter, by counter name", XLA, "counter")
XLA_METRIC_SAMPLES = _counter(
    "xla_metric_samples_total", "Samples recorded by every torch_xla metric, by metric name", XLA, "metric"
)
XLA_METRIC_SECONDS = _counter(
    "xla_metric_seconds_total", "Accumulated value of every torch_xla time metric, by metric name", XLA, "metric"
)
XLA_METRIC_BYTES = _counter(
    "xla_metric_bytes_total", "Accumulated value of every torch_xla byte metric, by metric name", XLA, "metric"
)
XLA_METRIC_VALUE = _counter(
    "xla_metric_value_total", "Accumulated value of every other torch_xla metric, by metric name", XLA, "metric"
)

# -- training steps on every backend (training/steps/) ------------------------------------------------------------
STEPS = "training_steps"
TRAINING_STEPS = _counter(
    "training_steps_total",
    "Training steps: rounds of torch.optim optimizer steps (each optimizer at most once), whatever runs the model; "
    "on an XLA device, the same steps as xla_steps_total",
    STEPS,
)
TRAINING_STEP_DURATION = Family(
    "training_step_duration_seconds",
    HISTOGRAM,
    "Wall time of a training step, from the end of the step before (the first from the optimizer's creation); on "
    "an XLA device, up to the step marker that runs its graph",
    STEPS,
)

# -- where the training thread's time goes, every backend (training/phases/) -------------------------------------
TIME_PHASES = "time_phases"
TRAINING_TIME = _counter(
    "training_time_seconds_total",
    "Wall time of the training thread by phase, from the start of the rank's first process of the run: step "
    "(productive), startup, data, compile, host_sync, checkpoint, other, and recovery (between a process's end and "
    "the next one's start); goodput is the step share",
    TIME_PHASES,
    "phase",
    values={"phase": PHASES},
)
TRAINING_RESTARTS = _counter(
    "training_restarts_total",
    "Processes of this rank of the run that ended without finishing and were followed by another process of it",
    TIME_PHASES,
)
TRAINING_LOST = _counter(
    "training_lost_seconds_total",
    "Step time of the steps this rank did again after a restart: an earlier process's steps at or past the step "
    "the next process resumed from (badput, inside phase step)",
    TIME_PHASES,
)

# -- the work the training steps do, every backend (training/throughput/) ----------------------------------------
THROUGHPUT = "throughput"
TRAINING_SAMPLES = _counter(
    "training_samples_total",
    "Samples in the batches the input pipeline handed the training thread: each batch's leading dimension",
    THROUGHPUT,
)
TRAINING_TOKENS = _counter(
    "training_tokens_total",
    "Tokens in the batches the input pipeline handed the training thread: the elements of their integer token-id "
    "tensors of two or more dimensions (input_ids)",
    THROUGHPUT,
)
TRAINING_FLOPS = _counter(
    "training_flops_total",
    "Floating-point operations of the training steps the rank ran, forward and backward, counted from the graphs "
    "and kernels themselves as torch.utils.flop_counter counts them (2 per multiply-add)",
    THROUGHPUT,
)
TRAINING_PEAK_FLOPS = _gauge(
    "training_peak_flops",
    "The peak floating-point operations per second of the rank's devices for the dtype it trains in (the peak_flops "
    "option, else the Trainium generation's table); absent where unknown",
    THROUGHPUT,
)

# -- torch.compile (training/torch_compile/) ----------------------------------------------------------------------
COMPILE = "torch_compile"
COMPILE_COMPILATIONS = _counter(
    "torch_compile_compilations_total",
    "Frames compiled by torch.compile (dynamo), by the compiled function's first line",
    COMPILE,
    "location",
)
COMPILE_RECOMPILATIONS = _counter(
    "torch_compile_recompilations_total",
    "Recompilations by torch.compile after a guard failed, by the compiled function's first line and the kind of guard",
    COMPILE,
    "location",
    "reason",
)
COMPILE_GRAPH_BREAKS = _counter(
    "torch_compile_graph_breaks_total",
    "Graph breaks found by torch.compile while compiling, by the user line that broke the graph and the kind of reason",
    COMPILE,
    "location",
    "reason",
)
COMPILE_LIMIT_HITS = _counter(
    "torch_compile_recompile_limit_hits_total",
    "Functions that hit torch.compile's recompile limit and run eagerly from then on, by the function's first line",
    COMPILE,
    "location",
)
COMPILE_SECONDS = _counter(
    "torch_compile_compile_seconds_total",
    "Time torch.compile spent compiling (dynamo and the backend, forward and backward graphs)",
    COMPILE,
)
COMPILE_READABLE = _gauge(
    "neuron_exporter_torch_compile_readable",
    "1 if the exporter reads this record of torch.compile on this torch, 0 if the private API of torch it comes "
    "from is missing or of a shape the exporter does not know (the log says which), by record",
    COMPILE,
    "record",
)

# -- TorchNeuron (training/neuron/) -------------------------------------------------------------------------------
NEURON = "neuron"
NEURON_FALLBACK_CALLS = _counter(
    "torchneuron_cpu_fallback_op_calls_total",
    "Calls of operators TorchNeuron registers from Python that ran on the CPU (each counted as it happens), by "
    "operator",
    NEURON,
    "op",
)
NEURON_FALLBACK_SITES = _gauge(
    "torchneuron_cpu_fallback_site_info",
    "Where a CPU-fallback operator counted per call was called (pass: forward, or backward for a call from the "
    "backward pass, named by the line that called backward()); always 1",
    NEURON,
    "op",
    "location",
    "pass",
)
NEURON_FALLBACK_OPS_SEEN = _gauge(
    "torchneuron_cpu_fallback_ops_seen",
    "Operators TorchNeuron ran on the CPU at least once (no Neuron kernel, a Python implementation that could not "
    "take the call, or a failure in the device pipeline), from its set of their names; always 1",
    NEURON,
    "op",
)
NEURON_HOST_READS = _counter(
    "torchneuron_host_reads_total",
    "Reads of neuron device data by the host (.item(), bool, print, .cpu(), ...; each waits for the device), by "
    "cause and source line",
    NEURON,
    "cause",
    "location",
)
NEURON_CACHE_HITS = _counter(
    "torchneuron_compile_cache_hits_total",
    "NEFFs found in TorchNeuron's compile cache, in memory or in the persistent cache (on disk)",
    NEURON,
    "tier",
)
NEURON_CACHE_MISSES = _counter(
    "torchneuron_compile_cache_misses_total", "NEFFs found in neither cache, compiled by neuronx-cc", NEURON
)
NEURON_COMPILATIONS = _counter(
    "torchneuron_compilations_total",
    "neuronx-cc compilations: of torch.compile graphs (during a dynamo compilation) or of eager operators' kernels",
    NEURON,
    "kind",
)
NEURON_COMPILE_SECONDS = _counter(
    "torchneuron_compile_seconds_total",
    "Time neuronx-cc spent compiling, of torch.compile graphs or of eager operators' kernels",
    NEURON,
    "kind",
)
NEURON_COMPILED_GRAPHS = _counter(
    "torchneuron_compiled_graphs_total",
    "Graphs the neuron backend of torch.compile compiled (forward and backward, from its cache or not)",
    NEURON,
)
NEURON_GRAPHS_WITH_COLLECTIVES = _counter(
    "torchneuron_graphs_with_collectives_total",
    "Compiled graphs with collective operations (all_reduce, all_gather, ...)",
    NEURON,
)
NEURON_GRAPH_FALLBACKS = _counter(
    "torchneuron_graph_fallbacks_total",
    "Compiled graphs (torch.compile, neuron backend) that failed to run and ran eagerly instead, by the reason "
    "TorchNeuron logged",
    NEURON,
    "reason",
)
NEURON_MEMORY_ALLOCATED = _gauge(
    "torchneuron_memory_allocated_bytes", "Device memory allocated by tensors now (torch.neuron.memory_stats)", NEURON
)
NEURON_MEMORY_ACTIVE_PEAK = _gauge(
    "torchneuron_memory_active_peak_bytes",
    "Peak of the device memory in active use since the process started or the user reset it",
    NEURON,
)
NEURON_MEMORY_OOMS = _counter(
    "torchneuron_memory_ooms_total", "Device allocations that failed for want of memory", NEURON
)
NEURON_MEMORY_RETRIES = _counter(
    "torchneuron_memory_alloc_retries_total",
    "Device allocations that succeeded only after freeing cached memory",
    NEURON,
)
NEURON_READABLE = _gauge(
    "neuron_exporter_torchneuron_readable",
    "1 if the exporter reads this record of TorchNeuron in this process, 0 if a name it comes from is missing or of "
    "another shape (the log says which), by record",
    NEURON,
    "record",
)

# -- the rank's own collector (training/rank_collector.py), in every attached process ----------------------------
RANK = "rank"
PROCESS_MEMORY = _gauge("training_process_resident_memory_bytes", "Resident memory of the training process", RANK)
PROCESS_CPU = _counter("training_process_cpu_seconds_total", "CPU time of the training process (user + system)", RANK)
PROCESS_THREADS = _gauge("training_process_threads", "Threads of the training process", RANK)
# The 0.1 names of the three above, served for one release more where torch_xla is imported (CHANGELOG 0.2.0).
OLD_PROCESS_MEMORY = _gauge("xla_process_resident_memory_bytes", PROCESS_MEMORY.help, RANK)
OLD_PROCESS_CPU = _counter("xla_process_cpu_seconds_total", PROCESS_CPU.help, RANK)
OLD_PROCESS_THREADS = _gauge("xla_process_threads", PROCESS_THREADS.help, RANK)
RANK_INFO = _gauge(
    "neuron_exporter_rank_info",
    "Where the rank runs: Kubernetes pod, namespace, node and container (from the downward API variables POD_NAME, "
    "POD_NAMESPACE, NODE_NAME, CONTAINER_NAME); always 1",
    RANK,
    "pod",
    "namespace",
    "node",
    "container",
)
PROCESS_INFO = Family(
    "neuron_exporter_process_info",
    GAUGE,
    "The rank's process as neuron-monitor labels it (EC2 instance, runtime_tag), and its pid; always 1",
    RANK,
    ("instance_id", "runtime_tag", "pid"),
)
NEURONCORE_INFO = Family(
    "neuron_exporter_neuroncore_info",
    GAUGE,
    "A NeuronCore of the rank's process (NEURON_RT_VISIBLE_CORES), numbered as neuron-monitor numbers it; always 1",
    RANK,
    ("instance_id", "runtime_tag", "neuroncore", "logical_nc_config"),
)
BUILD_INFO = _gauge(
    "neuron_exporter_build_info",
    "Versions of the exporter and of what it runs with",
    RANK,
    "version",
    "torch_version",
    "torch_xla_version",
    "python_version",
)
COLLECTION_ERRORS = _counter(
    "neuron_exporter_collection_errors_total",
    "Failures inside the exporter, by stage (step hook, scrape, spool write)",
    RANK,
    "stage",
)
SOURCE_STARTED = _gauge(
    "neuron_exporter_source_started",
    "1 once a source's hooks are in, 0 while its library is imported but it could not start (it tries again when "
    "an optimizer is created or steps, up to 10 times)",
    RANK,
    "source",
)
STEP_HOOK_SECONDS = _counter(
    "neuron_exporter_step_hook_seconds_total", "Time the exporter spent in its step hook, on the training thread", RANK
)
COLLECTOR_SUCCESS = _gauge(
    "neuron_exporter_collector_success", "1 if the collector's last scrape succeeded, 0 if it failed", RANK, "collector"
)
COLLECTOR_DURATION = _gauge(
    "neuron_exporter_collector_duration_seconds", "Time the collector's last scrape took", RANK, "collector"
)

# -- the node endpoint (node/) -----------------------------------------------------------------------------------
NODE = "node"
RANK_UP = _gauge("neuron_exporter_rank_up", "1 if the rank is running, 0 if it is hung or dead", NODE)
RANK_STATE = _gauge(
    "neuron_exporter_rank_state", "The rank's state: 1 for the current one of running, hung, dead", NODE, "state",
    values={"state": RANK_STATES},
)  # fmt: skip
RANK_LAST_REPORT = _gauge(
    "neuron_exporter_rank_last_report_timestamp_seconds", "When the rank last reported progress (unix time)", NODE
)
RANKS = Family(
    "neuron_exporter_ranks", GAUGE, "Ranks the node endpoint serves (running, hung, dead or finished)", NODE, (), False
)
SPOOL_REJECTED = Family(
    "neuron_exporter_spool_rejected_files",
    GAUGE,
    "Files in the spool directory that are not served, by reason (see the log)",
    NODE,
    ("reason",),
    False,
)
SPOOL_DIRECTORY_OK = Family(
    "neuron_exporter_spool_directory_ok",
    GAUGE,
    "0 if the spool directory is unsafe to read (see the log), else 1 (also before it exists)",
    NODE,
    (),
    False,
)
HOST_CPU = Family(
    "neuron_exporter_host_cpu_seconds_total",
    COUNTER,
    "CPU time of the host, all cores, by mode",
    NODE,
    ("mode",),
    False,
)
HOST_MEMORY_TOTAL = Family(
    "neuron_exporter_host_memory_total_bytes", GAUGE, "Physical memory of the host", NODE, (), False
)
HOST_MEMORY_AVAILABLE = Family(
    "neuron_exporter_host_memory_available_bytes",
    GAUGE,
    "Memory of the host available to new processes without swapping",
    NODE,
    (),
    False,
)
# The daemon's own version (serve, run): no rank labels, and of the versions only its own and Python's.
DAEMON_BUILD_INFO = Family(BUILD_INFO.name, GAUGE, BUILD_INFO.help, NODE, ("version", "python_version"), False)


FAMILIES: dict[str, Family] = {
    family.name: family
    for family in list(globals().values())
    if isinstance(family, Family) and family is not DAEMON_BUILD_INFO
}
SERIES: frozenset[str] = frozenset(name for family in FAMILIES.values() for name in family.series())


def catalogued(family: Family) -> bool:
    """Whether ``family`` is an entry of the catalogue (the daemon's build_info is one, under the rank's name)."""
    return FAMILIES.get(family.name) is family or family is DAEMON_BUILD_INFO
