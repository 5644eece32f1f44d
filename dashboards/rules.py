"""Prometheus recording and alert rules for neuron-exporter, generated from the configuration in config.py.

Recording rules hold the per-rank ratios (per ``aggregation_labels`` + instance, rank, local_rank, over a fixed
5m window so their names stay stable) and the per-run ratios by site (per ``aggregation_labels`` + location, and
cause for graph cuts). Training alerts are per run (``aggregation_labels``, by default cluster, namespace, job
and run_id) and, where it applies, per operator or stage: a CPU-fallback operator on all 2,048 ranks of a job is
one alert. Its value is the number of ranks affected, and its description names the worst rank and, for graph
cuts and recompilations, the top site (template queries); the per-rank and per-site detail is on the
dashboards. Every alert carries a ``severity`` label and the annotations ``summary``, ``description`` and
``runbook_url`` (the configured base URL and an anchor named after the alert).
"""

from __future__ import annotations

from .config import DEFAULTS, Config

ALERTS_FILE = "neuron-exporter-alerts.yml"
RECORDING_FILE = "neuron-exporter-recording.yml"

WINDOW = "5m"

# Recording rule names.
STEPS = f"rank:xla_steps:rate{WINDOW}"
GRAPHS_PER_STEP = f"rank:xla_graphs_per_step:avg{WINDOW}"
CUTS_PER_STEP = f"rank:xla_graph_cuts_per_step:ratio{WINDOW}"
MARKERS_PER_STEP = f"rank:xla_step_markers_per_step:ratio{WINDOW}"
FRAGMENTED_STEPS = f"rank:xla_fragmented_steps:ratio{WINDOW}"
RECOMPILATIONS_PER_STEP = f"rank:xla_recompilations_per_step:ratio{WINDOW}"
HOST_READS_PER_STEP = f"rank:xla_device_to_host_transfers_per_step:ratio{WINDOW}"
COMPILE_TIME_SHARE = f"rank:xla_compile_time_share:ratio{WINDOW}"
EXECUTE_TIME_SHARE = f"rank:xla_execute_time_share:ratio{WINDOW}"
FALLBACK_RATE = f"rank_op:xla_cpu_fallback_ops:rate{WINDOW}"
# Per run and site: a site's events per training step of the run (its rate summed over the run's ranks, over the
# run's steps summed over its ranks), so the sites of a run add up to the run's own ratio.
SITE_CUTS_PER_STEP = f"run_location:xla_graph_cuts_per_step:ratio{WINDOW}"
SITE_RECOMPILATIONS_PER_STEP = f"run_location:xla_recompilations_per_step:ratio{WINDOW}"

# The rank an alert's description names, from the first sample of a template query.
RANK_OF_SAMPLE = 'rank {{ label "rank" . }} (local rank {{ label "local_rank" . }}) of {{ label "instance" . }}'
# The labels of the rank lookups (the per-rank labels beyond the aggregation labels).
RANK_ONLY = "instance, rank, local_rank"


def labels(*names: str) -> str:
    """A label list for by/on: each name once, in order."""
    return ", ".join(dict.fromkeys(names))


def select(c: Config, metric: str, *matchers: str) -> str:
    """``metric{selector, matchers}`` (no braces when there is nothing to match)."""
    inside = ", ".join(m for m in (c.selector.strip(), *matchers) if m)
    return f"{metric}{{{inside}}}" if inside else metric


def recording_rules(c: Config = DEFAULTS) -> dict[str, str]:
    """{name: expression}; evaluated in this order, so later rules use earlier ones. Per-step ratios have no
    value while a rank (or run) makes no training step (an evaluation phase, a stall): ``> 0`` on the step rate.

    The per-rank ratios sum over the sites of the labelled counters: ``xla_recompilations_total{location}``
    counts recompilations only (a computation compiled again for other shapes or Python values), never new graphs.
    A rank's recompilations per step count only once the rank had made its warm-up steps
    (``neuron_exporter_warmup_steps``) at the window's first sample: the first steps may try a few shapes.
    """
    rank = labels(*c.rank_labels)
    run = labels(*c.run_labels)

    def rate(metric: str) -> str:
        return f"sum by ({rank}) (rate({select(c, metric)}[{WINDOW}]))"

    def per_step(metric: str) -> str:
        return f"{rate(metric)}\n/\n({STEPS} > 0)"

    def per_run_step(metric: str, *site: str) -> str:
        # Series without a location (an exporter from before sites) have no site to name.
        sited = select(c, metric, 'location!=""')
        return (
            f"sum by ({labels(*c.run_labels, *site)}) (rate({sited}[{WINDOW}]))\n"
            f"/ on ({run}) group_left\nsum by ({run}) ({STEPS} > 0)"
        )

    return {
        STEPS: rate("xla_steps_total"),
        GRAPHS_PER_STEP: f"{rate('xla_graphs_per_step_sum')}\n/\n({rate('xla_graphs_per_step_count')} > 0)",
        CUTS_PER_STEP: per_step("xla_graph_cuts_total"),
        MARKERS_PER_STEP: per_step("xla_step_markers_total"),
        FRAGMENTED_STEPS: per_step("xla_fragmented_steps_total"),
        RECOMPILATIONS_PER_STEP: (
            f"{per_step('xla_recompilations_total')}\nand on ({rank})\n"
            f"(sum by ({rank}) (min_over_time({select(c, 'xla_steps_total')}[{WINDOW}]))\n"
            f" >= sum by ({rank}) ({select(c, 'neuron_exporter_warmup_steps')}))"
        ),
        HOST_READS_PER_STEP: per_step("xla_device_to_host_transfers_total"),
        COMPILE_TIME_SHARE: f"{rate('xla_compile_seconds_total')}\n/\n({rate('xla_step_duration_seconds_sum')} > 0)",
        EXECUTE_TIME_SHARE: f"{rate('xla_execute_seconds_total')}\n/\n({rate('xla_step_duration_seconds_sum')} > 0)",
        FALLBACK_RATE: f"sum by ({labels(*c.rank_labels, 'op')}) (rate({select(c, 'xla_cpu_fallback_ops_total')}"
        f"[{WINDOW}]))",
        SITE_CUTS_PER_STEP: per_run_step("xla_graph_cuts_total", "cause", "location"),
        SITE_RECOMPILATIONS_PER_STEP: per_run_step("xla_recompilations_total", "location"),
    }


# -- annotation templates ------------------------------------------------------------------------------------------


def go_string(text: str) -> str:
    """``text`` as a Go template string literal."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def run_name(c: Config) -> str:
    """Template text naming the alert's run by its aggregation labels: "cluster c1, namespace ml, job train,
    run 42" (labels the alert does not have are left out)."""
    parts = ['{{ $sep := "" }}']
    for label in c.aggregation_labels:
        word = "run" if label == "run_id" else label
        parts.append(
            f'{{{{ with $labels.{label} }}}}{{{{ $sep }}}}{word} {{{{ . }}}}{{{{ $sep = ", " }}}}{{{{ end }}}}'
        )
    return "".join(parts)


def rank_lookup(c: Config, query: str, body: str, *extra_labels: str, with_selector: bool = True) -> str:
    """Template text that runs ``query`` for the alert's run and renders ``body`` with its first sample as ``.``.

    ``query`` is PromQL in which ``MATCH`` stands for the matchers of the alert's run: the selector (unless
    ``with_selector`` is false, for recorded series), every aggregation label and ``extra_labels`` equal to the
    alert's values. A label the alert lacks matches series without it.
    """
    names = (*c.aggregation_labels, *extra_labels)
    matchers = [c.selector.strip().replace("%", "%%")] if with_selector and c.selector.strip() else []
    matchers += [f"{name}=%q" for name in names]
    promql = query.replace("%", "%%").replace("MATCH", ", ".join(matchers))
    arguments = " ".join(f"$labels.{name}" for _ in range(query.count("MATCH")) for name in names)
    return (
        f"{{{{ with printf {go_string(promql)} {arguments} | query }}}}{{{{ with first . }}}}{body}"
        "{{ end }}{{ end }}"
    )


def worst_recorded(c: Config, record: str, value_text: str) -> str:
    """The rank with the highest value of a per-rank recording rule in the alert's run."""
    return rank_lookup(c, f"topk(1, {record}{{MATCH}})", f"{RANK_OF_SAMPLE} with {value_text}", with_selector=False)


def top_site(c: Config, record: str, what: str) -> str:
    """A sentence naming the site (source line, and cause where the record has one) with the highest value of a
    per-run, per-site recording rule in the alert's run; nothing when the run has no site."""
    cause = '{{ with label "cause" . }} ({{ . }}){{ end }}'
    return rank_lookup(
        c,
        f"topk(1, {record}{{MATCH}})",
        ' Top site: {{ label "location" . }}'
        + cause
        + ', {{ value . | printf "%.2f" }} '
        + what
        + " per training step over the run's ranks.",
        with_selector=False,
    )


def first_to_stop(c: Config, state: str) -> str:
    """The rank in ``state`` whose last report is the oldest, in the alert's run."""
    return rank_lookup(
        c,
        f"bottomk(1, max by ({RANK_ONLY}) (neuron_exporter_rank_last_report_timestamp_seconds{{MATCH}})"
        f' and on ({RANK_ONLY}) (max by ({RANK_ONLY}) (neuron_exporter_rank_state{{MATCH, state="{state}"}})'
        " == 1))",
        RANK_OF_SAMPLE,
    )


# -- alerts --------------------------------------------------------------------------------------------------------


def alert(c: Config, name: str, expr: str, for_: str, severity: str, summary: str, description: str) -> dict:
    return {
        "alert": name,
        "expr": expr,
        "for": for_,
        "labels": {"severity": severity},
        "annotations": {
            "summary": summary,
            "description": description,
            "runbook_url": f"{c.runbook_url}#{name.lower()}",
        },
    }


def alert_rules(c: Config = DEFAULTS) -> list[dict]:
    run = labels(*c.run_labels)
    rank = labels(*c.rank_labels)
    in_run = f"in {run_name(c)}"
    affected = "Ranks affected: {{ $value }}"
    see_dashboard = " Every rank: the Fragmentation & recompiles dashboard."
    see_sites = " Every rank and site: the Fragmentation & recompiles dashboard."
    hung = select(c, "neuron_exporter_rank_state", 'state="hung"')
    dead = select(c, "neuron_exporter_rank_state", 'state="dead"')
    hung_or_dead = select(c, "neuron_exporter_rank_state", 'state=~"hung|dead"')

    def over(record: str, op: str, threshold: float) -> str:
        return f"count by ({run}) (\n  {record} {op} {threshold:g}\n)"

    return [
        alert(
            c,
            "XlaCpuFallbackOp",
            f"count by ({labels(*c.run_labels, 'op')}) (\n"
            f"  sum by ({labels(*c.rank_labels, 'op')}) "
            f"(increase({select(c, 'xla_cpu_fallback_ops_total')}[{c.fallback_window}])) > 0\n)",
            c.fallback_for,
            c.fallback_severity,
            "Operator {{ $labels.op }} runs on the CPU " + in_run,
            "{{ $labels.op }} has no XLA lowering: it ran on the CPU in the last "
            + c.fallback_window
            + " "
            + in_run
            + ". "
            + affected
            + "; most calls: "
            + rank_lookup(
                c,
                f"topk(1, sum by ({RANK_ONLY}) (increase(xla_cpu_fallback_ops_total{{MATCH}}[{c.fallback_window}])))",
                RANK_OF_SAMPLE + ' ({{ value . | printf "%.0f" }})',
                "op",
            )
            + ". Every call cuts the graph and copies its tensors to the host and back."
            + see_dashboard,
        ),
        alert(
            c,
            "XlaRecompilationStorm",
            over(RECOMPILATIONS_PER_STEP, ">", c.recompilations_per_step),
            c.recompilation_for,
            c.recompilation_severity,
            "The graph keeps recompiling " + in_run,
            f"More than {c.recompilations_per_step:g} recompilations per training step after warm-up "
            + in_run
            + ". "
            + affected
            + "; worst: "
            + worst_recorded(c, RECOMPILATIONS_PER_STEP, '{{ value . | printf "%.2f" }} per step')
            + "."
            + top_site(c, SITE_RECOMPILATIONS_PER_STEP, "recompilations")
            + " Input shapes or Python values baked into the graph keep changing; neuron-exporter diagnose on a"
            " rank's endpoint names the upload whose shape changed." + see_sites,
        ),
        alert(
            c,
            "XlaGraphFragmentation",
            over(CUTS_PER_STEP, ">=", c.graph_cuts_per_step),
            c.fragmentation_for,
            c.fragmentation_severity,
            "Training steps are cut into several graphs " + in_run,
            f"At least {c.graph_cuts_per_step:g} graph cuts per training step "
            + in_run
            + ". "
            + affected
            + "; worst: "
            + worst_recorded(c, CUTS_PER_STEP, '{{ value . | printf "%.2f" }} cuts per step')
            + "."
            + top_site(c, SITE_CUTS_PER_STEP, "cuts")
            + " Something needs a device value before the step ends: .item(), print, an if on a tensor, "
            ".cpu() or a CPU-fallback operator." + see_sites,
        ),
        alert(
            c,
            "XlaFrequentHostReads",
            over(HOST_READS_PER_STEP, ">", c.host_reads_per_step),
            c.host_reads_for,
            c.host_reads_severity,
            "Device data is read on the host every step " + in_run,
            f"More than {c.host_reads_per_step:g} device-to-host transfers per training step "
            + in_run
            + ". "
            + affected
            + "; worst: "
            + worst_recorded(c, HOST_READS_PER_STEP, '{{ value . | printf "%.2f" }} per step')
            + ". Each read waits for the device and may cut the graph."
            + see_dashboard,
        ),
        alert(
            c,
            "XlaCompileTimeDominates",
            over(COMPILE_TIME_SHARE, ">", c.compile_time_share),
            c.compile_time_for,
            c.compile_time_severity,
            "Compiling takes most of the step time " + in_run,
            f"Compilation takes more than {c.compile_time_share:.0%} of the step wall time "
            + in_run
            + ". "
            + affected
            + "; worst: "
            + worst_recorded(c, COMPILE_TIME_SHARE, "{{ value . | humanizePercentage }}")
            + "."
            + see_dashboard,
        ),
        alert(
            c,
            "XlaTrainingStalled",
            f"count by ({run}) (\n"
            f"  sum by ({rank}) (increase({select(c, 'xla_steps_total')}[{c.stall_window}])) == 0\n"
            f"  unless on ({rank})\n"
            f"  (max by ({rank}) ({hung_or_dead}) == 1)\n)",
            c.stall_for,
            c.stall_severity,
            "Training has stalled " + in_run,
            f"No training step ended in the last {c.stall_window} "
            + in_run
            + ", while the metrics endpoints still answer. "
            + affected
            + ", for example "
            + rank_lookup(
                c,
                f"topk(1, sum by ({RANK_ONLY}) (increase(xla_steps_total{{MATCH}}[{c.stall_window}])) == 0)",
                RANK_OF_SAMPLE,
            )
            + ".",
        ),
        *torch_compile_alerts(c),
        alert(
            c,
            "NeuronExporterRankHung",
            f"count by ({run}) (\n  max by ({rank}) ({hung}) == 1\n)",
            c.rank_hung_for,
            c.rank_hung_severity,
            "Ranks have stopped reporting " + in_run,
            "The node endpoints mark ranks " + in_run + " as hung: their processes are alive but have reported no "
            "step within hung_after_seconds. " + affected + "; the first to stop: " + first_to_stop(c, "hung") + ".",
        ),
        alert(
            c,
            "NeuronExporterRankDead",
            f"count by ({run}) (\n  max by ({rank}) ({dead}) == 1\n)",
            c.rank_dead_for,
            c.rank_dead_severity,
            "Rank processes are gone " + in_run,
            "The node endpoints mark ranks "
            + in_run
            + " as dead: their processes exited without finishing. "
            + affected
            + "; the first to stop: "
            + first_to_stop(c, "dead")
            + ". Their last counters stay visible until they expire.",
        ),
        alert(
            c,
            "NeuronExporterDown",
            f"{select(c, 'up')} == 0",
            c.exporter_down_for,
            c.exporter_down_severity,
            "neuron-exporter endpoint {{ $labels.instance }} is down",
            "Prometheus cannot scrape {{ $labels.instance }} (job {{ $labels.job }}): the training process or the "
            "node daemon is not serving /metrics.",
        ),
        alert(
            c,
            "NeuronExporterCollectionErrors",
            f"count by ({labels(*c.run_labels, 'stage')}) (\n"
            f"  sum by ({labels(*c.rank_labels, 'stage')}) (increase("
            f"{select(c, 'neuron_exporter_collection_errors_total')}[{c.collection_errors_window}])) > 0\n)",
            c.collection_errors_for,
            c.collection_errors_severity,
            "neuron-exporter fails to collect ({{ $labels.stage }}) " + in_run,
            "Collection errors at stage {{ $labels.stage }} in the last "
            + c.collection_errors_window
            + " "
            + in_run
            + ". "
            + affected
            + "; most errors: "
            + rank_lookup(
                c,
                f"topk(1, sum by ({RANK_ONLY}) (increase(neuron_exporter_collection_errors_total"
                f"{{MATCH}}[{c.collection_errors_window}])))",
                RANK_OF_SAMPLE + ' ({{ value . | printf "%.0f" }})',
                "stage",
            )
            + ". The metrics of these ranks may be incomplete.",
        ),
        alert(
            c,
            "NeuronExporterCollectorFailing",
            f"count by ({labels(*c.run_labels, 'collector')}) (\n"
            f"  min by ({labels(*c.rank_labels, 'collector')}) "
            f"({select(c, 'neuron_exporter_collector_success')}) == 0\n)",
            c.collector_failing_for,
            c.collector_failing_severity,
            "neuron-exporter collector {{ $labels.collector }} fails " + in_run,
            "The last run of collector {{ $labels.collector }} failed "
            + in_run
            + "; its series are missing or stale. "
            + affected
            + ", for example "
            + rank_lookup(
                c,
                f"topk(1, min by ({RANK_ONLY}) (neuron_exporter_collector_success{{MATCH}}) == 0)",
                RANK_OF_SAMPLE,
                "collector",
            )
            + ".",
        ),
        alert(
            c,
            "NeuronExporterSpoolFileRejected",
            f"max by ({labels(*c.aggregation_labels, 'instance', 'reason')}) "
            f"({select(c, 'neuron_exporter_spool_rejected_files')}) > 0",
            c.spool_rejected_for,
            c.spool_rejected_severity,
            "The node endpoint {{ $labels.instance }} refuses files in its spool directory ({{ $labels.reason }})",
            "Files in the spool directory of {{ $labels.instance }} that the node endpoint does not serve (reason "
            "{{ $labels.reason }}): {{ $value }}. Something wrote a file the endpoint does not trust, or the "
            "endpoint cannot read it; the ranks of those files are missing from the metrics. The endpoint logs "
            "each file once.",
        ),
        alert(
            c,
            "NeuronExporterSpoolDirectoryNotOk",
            f"min by ({labels(*c.aggregation_labels, 'instance')}) "
            f"({select(c, 'neuron_exporter_spool_directory_ok')}) == 0",
            c.spool_directory_for,
            c.spool_directory_severity,
            "The node endpoint {{ $labels.instance }} does not read its spool directory",
            "The spool directory of {{ $labels.instance }} is missing, or more open than spool_mode allows, or "
            "another user's: the node endpoint serves no rank from it. The endpoint logs the reason once.",
        ),
    ]


def torch_compile_alerts(c: Config) -> list[dict]:
    """torch.compile (dynamo), whatever the backend: recompilations that go on after warm-up, functions at the
    recompile limit, graph breaks found after warm-up. A rank is warmed up once its process has run for
    ``torch_compile_warmup_window``: its CPU-time counter existed that long ago and has not been reset since (a
    restarted process compiles afresh)."""
    run = labels(*c.run_labels)
    rank = labels(*c.rank_labels)
    in_run = f"in {run_name(c)}"
    affected = "Ranks affected: {{ $value }}"
    window, warmup = c.torch_compile_window, c.torch_compile_warmup_window
    cpu = select(c, "xla_process_cpu_seconds_total")
    warmed_up = (
        f"(\n    max by ({rank}) ({cpu} offset {warmup})\n    unless on ({rank})\n"
        f"    max by ({rank}) (resets({cpu}[{warmup}])) > 0\n  )"
    )
    see = " Every rank, function and line: the torch.compile dashboard; neuron-exporter diagnose on a rank's endpoint"

    def new(selected: str, by: str, separator: str = " ") -> str:
        """What a counter gained over the window, per ``by``, counting a series that appeared within it from 0
        (a new line or reason is exported from its first count on, which increase() would miss)."""
        now = f"sum by ({by}) ({selected})"
        return f"{now}{separator}- (sum by ({by}) ({selected} offset {window}) or 0 * {now})"

    def after_warmup(metric: str) -> str:
        return (
            f"count by ({run}) (\n"
            f"  (\n    {new(select(c, metric), rank, chr(10) + '    ')}\n  ) > 0\n"
            f"  and on ({rank})\n  {warmed_up}\n)"
        )

    def most(metric: str, what: str) -> str:
        return rank_lookup(
            c,
            f"topk(1, {new(metric + '{MATCH}', RANK_ONLY)})",
            RANK_OF_SAMPLE + ' ({{ value . | printf "%.0f" }} ' + what + ")",
        )

    def top(metric: str, what: str) -> str:
        return rank_lookup(
            c,
            f"topk(1, {new(metric + '{MATCH}', 'location, reason')})",
            ' Top line: {{ label "location" . }} ({{ label "reason" . }}), '
            '{{ value . | printf "%.0f" }} ' + what + f" in the last {window} over the run's ranks.",
        )

    return [
        alert(
            c,
            "TorchCompileRecompiling",
            after_warmup("torch_compile_recompilations_total"),
            c.torch_compile_recompile_for,
            c.torch_compile_recompile_severity,
            "torch.compile keeps recompiling after warm-up " + in_run,
            f"torch.compile recompiled functions after a guard failed, in every {window} for "
            f"{c.torch_compile_recompile_for}, on ranks that have run for more than {warmup} "
            + in_run
            + ". "
            + affected
            + "; most recompilations: "
            + most("torch_compile_recompilations_total", "recompilations")
            + "."
            + top("torch_compile_recompilations_total", "recompilations")
            + " Each recompilation stops the step while dynamo and the backend compile."
            + see
            + " shows the guards that failed.",
        ),
        alert(
            c,
            "TorchCompileRecompileLimit",
            f"count by ({labels(*c.run_labels, 'location')}) (\n"
            f"  sum by ({labels(*c.rank_labels, 'location')}) "
            f"({select(c, 'torch_compile_recompile_limit_hits_total')}) > 0\n)",
            c.torch_compile_limit_for,
            c.torch_compile_limit_severity,
            "A function at {{ $labels.location }} hit torch.compile's recompile limit " + in_run,
            "The function at {{ $labels.location }} recompiled torch._dynamo.config.recompile_limit times and runs "
            "without compiling from then on "
            + in_run
            + ". "
            + affected
            + ", for example "
            + rank_lookup(
                c,
                f"topk(1, sum by ({RANK_ONLY}) (torch_compile_recompile_limit_hits_total{{MATCH}}))",
                RANK_OF_SAMPLE,
                "location",
            )
            + "."
            + see
            + " shows the guards that failed.",
        ),
        alert(
            c,
            "TorchCompileGraphBreaks",
            after_warmup("torch_compile_graph_breaks_total"),
            c.torch_compile_graph_break_for,
            c.torch_compile_graph_break_severity,
            "torch.compile found new graph breaks after warm-up " + in_run,
            f"torch.compile broke graphs in the last {window} on ranks that have run for more than {warmup} "
            + in_run
            + ": a code path compiled late, or a recompilation that breaks. "
            + affected
            + "; most graph breaks: "
            + most("torch_compile_graph_breaks_total", "graph breaks")
            + "."
            + top("torch_compile_graph_breaks_total", "graph breaks")
            + " The code between two graphs runs eagerly at every call."
            + see
            + " shows dynamo's reason.",
        ),
    ]


def rule_files(c: Config = DEFAULTS) -> dict[str, dict]:
    """{file name: rule file content} for the two files Prometheus loads."""
    recording = [{"record": name, "expr": expr} for name, expr in recording_rules(c).items()]
    return {
        RECORDING_FILE: {"groups": [{"name": "neuron-exporter.recording", "rules": recording}]},
        ALERTS_FILE: {"groups": [{"name": "neuron-exporter.alerts", "rules": alert_rules(c)}]},
    }


RECORDING_RULES = recording_rules(DEFAULTS)  # the default expressions, by name
