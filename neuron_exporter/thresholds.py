"""When a figure is a problem: the defaults of the alerts and dashboards (``mixin/config.py``, where a deployment
overrides them) and the thresholds of ``neuron-exporter explain``, which reads a saved report with the same
judgement as the alerts."""

HOST_READS_PER_STEP = 0.5  # device-to-host reads per training step (torch_xla's own analyzer warns above this too)
RECOMPILATIONS_PER_STEP = 0.1  # compilations after warm-up per training step: one step in ten
GRAPH_CUTS_PER_STEP = 0.5  # graphs cut off before the step marker, per training step
COMPILE_TIME_SHARE = 0.5  # of the step time spent compiling
GOODPUT_MIN = 0.5  # share of the training thread's time spent in training steps (the rest: badput by phase)
STRAGGLER_EXCESS_SHARE = 0.1  # a rank's badput per step above the run's median rank's, of the run's time per step
STARTUP_MAX_SECONDS = 1800.0  # from a process's start to its first training steps, compiling included
