"""The values of the labels that dashboards, rules, docs and the diagnosis name, each written here once; the
catalogue's entry of each family declares its labels' values from these (``Family.values``), and the tests check
every place that names one against them."""

# training_time_seconds_total{phase}: where the training thread's time goes; GOODPUT_PHASE is the productive one.
# RECOVERY_PHASE is the run's, not a process's: from the end of a rank's process to the start of the next one.
PHASES = ("startup", "data", "compile", "host_sync", "checkpoint", "step", "other", "recovery")
RECOVERY_PHASE = "recovery"
GOODPUT_PHASE = "step"
# neuron_exporter_rank_state{state}
RANK_STATES = ("running", "hung", "dead")
# xla_host_reads_total{cause}: the host reads (the Tensor method that read); xla_graph_cuts_total{cause} also has
# a sync of chosen tensors, a CPU-fallback operator and a cut no read explains.
READ_CAUSES = ("item", "bool", "int", "float", "index", "tolist", "numpy", "cpu", "print")
SYNC_TENSORS, CPU_FALLBACK, UNATTRIBUTED = "sync_tensors", "cpu_fallback", "unattributed"
CUT_CAUSES = (*READ_CAUSES, SYNC_TENSORS, CPU_FALLBACK, UNATTRIBUTED)
