"""Prometheus recording and alert rules for neuron-exporter, generated from the configuration in config.py.

Recording rules hold the per-rank ratios (per ``aggregation_labels`` + instance, rank, local_rank, over a fixed
5m window so their names stay stable) and the per-run ratios by site (per ``aggregation_labels`` + location, and
cause for graph cuts). Training alerts are per run (``aggregation_labels``, by default cluster, namespace, job
and run_id) and, where it applies, per operator or stage: a CPU-fallback operator on all 2,048 ranks of a job is
one alert. Its value is the number of ranks affected, and its description names the worst rank and, for graph
cuts and recompilations, the top site (template queries); the per-rank and per-site detail is on the
dashboards. Every alert carries a ``severity`` label and the annotations ``summary``, ``description`` and
``runbook_url`` (the configured base URL and an anchor named after the alert).

Every expression and annotation is written out as one PromQL or Go-template text in which ``${name}`` stands for
what the configuration decides (labels, selectors, windows, thresholds) and is filled in by ``fill``. The alerts
come in one group per topic: XLA training, torch.compile, and the exporter itself.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Callable

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

# The rule groups: recording rules first (the alerts read them), then the alerts by topic.
RECORDING_GROUP = "neuron-exporter.xla.recording"
XLA_GROUP = "neuron-exporter.xla"
TORCH_COMPILE_GROUP = "neuron-exporter.torch_compile"
EXPORTER_GROUP = "neuron-exporter.exporter"

# The rank an alert's description names, from the first sample of a template query.
RANK = 'rank {{ label "rank" . }} (local rank {{ label "local_rank" . }}) of {{ label "instance" . }}'

PLACEHOLDER = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def fill(template: str, **values: str) -> str:
    """``template`` with every ``${name}`` replaced by ``values[name]``.

    A template that starts with a newline is PromQL over several lines, indented like the code around it: it
    loses that indentation and its first and last newlines. A placeholder without a value, a value without a
    placeholder, or a ``${`` that starts no placeholder raises ValueError, so a typo fails the build. Go templates
    keep their ``$value`` and ``$labels``: only ``${...}`` is a placeholder.
    """
    if template.startswith("\n"):
        template = textwrap.dedent(template).strip("\n")
    names = PLACEHOLDER.findall(template)
    if template.count("${") != len(names):
        raise ValueError(f"a malformed placeholder in {template!r}")
    missing, unused = set(names) - set(values), set(values) - set(names)
    if missing or unused:
        raise ValueError(f"placeholders without values {sorted(missing)}, values without placeholders {sorted(unused)}")
    return PLACEHOLDER.sub(lambda match: values[match.group(1)], template)


def labels(*names: str) -> str:
    """A label list for by/on: each name once, in order."""
    return ", ".join(dict.fromkeys(names))


def select(c: Config, metric: str, *matchers: str) -> str:
    """``metric{selector, matchers}`` (no braces when there is nothing to match)."""
    inside = ", ".join(m for m in (c.selector.strip(), *matchers) if m)
    return f"{metric}{{{inside}}}" if inside else metric


# -- recording rules -----------------------------------------------------------------------------------------------


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
        return fill(
            "sum by (${rank}) (rate(${counter}[${window}]))", rank=rank, counter=select(c, metric), window=WINDOW
        )

    def per_step(metric: str) -> str:
        return fill(
            """
            sum by (${rank}) (rate(${counter}[${window}]))
            /
            (${steps} > 0)
            """,
            rank=rank,
            counter=select(c, metric),
            window=WINDOW,
            steps=STEPS,
        )

    def ratio(numerator: str, denominator: str) -> str:
        return fill(
            """
            sum by (${rank}) (rate(${numerator}[${window}]))
            /
            (sum by (${rank}) (rate(${denominator}[${window}])) > 0)
            """,
            rank=rank,
            numerator=select(c, numerator),
            denominator=select(c, denominator),
            window=WINDOW,
        )

    def per_run_step(metric: str, *site: str) -> str:
        # Series without a location (an exporter from before sites) have no site to name.
        return fill(
            """
            sum by (${run_site}) (rate(${counter}[${window}]))
            / on (${run}) group_left
            sum by (${run}) (${steps} > 0)
            """,
            run_site=labels(*c.run_labels, *site),
            run=run,
            counter=select(c, metric, 'location!=""'),
            window=WINDOW,
            steps=STEPS,
        )

    recompilations_after_warmup = fill(
        """
        sum by (${rank}) (rate(${recompilations}[${window}]))
        /
        (${steps} > 0)
        and on (${rank})
        (sum by (${rank}) (min_over_time(${steps_total}[${window}]))
         >= sum by (${rank}) (${warmup_steps}))
        """,
        rank=rank,
        recompilations=select(c, "xla_recompilations_total"),
        steps_total=select(c, "xla_steps_total"),
        warmup_steps=select(c, "neuron_exporter_warmup_steps"),
        window=WINDOW,
        steps=STEPS,
    )
    return {
        STEPS: rate("xla_steps_total"),
        GRAPHS_PER_STEP: ratio("xla_graphs_per_step_sum", "xla_graphs_per_step_count"),
        CUTS_PER_STEP: per_step("xla_graph_cuts_total"),
        MARKERS_PER_STEP: per_step("xla_step_markers_total"),
        FRAGMENTED_STEPS: per_step("xla_fragmented_steps_total"),
        RECOMPILATIONS_PER_STEP: recompilations_after_warmup,
        HOST_READS_PER_STEP: per_step("xla_device_to_host_transfers_total"),
        COMPILE_TIME_SHARE: ratio("xla_compile_seconds_total", "xla_step_duration_seconds_sum"),
        EXECUTE_TIME_SHARE: ratio("xla_execute_seconds_total", "xla_step_duration_seconds_sum"),
        FALLBACK_RATE: fill(
            "sum by (${rank_op}) (rate(${fallback_ops}[${window}]))",
            rank_op=labels(*c.rank_labels, "op"),
            fallback_ops=select(c, "xla_cpu_fallback_ops_total"),
            window=WINDOW,
        ),
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
    return '{{ $sep := "" }}' + "".join(
        fill(
            '{{ with $labels.${label} }}{{ $sep }}${word} {{ . }}{{ $sep = ", " }}{{ end }}',
            label=label,
            word="run" if label == "run_id" else label,
        )
        for label in c.aggregation_labels
    )


def rank_lookup(c: Config, query: str, body: str, *extra_labels: str, with_selector: bool = True, **values: str) -> str:
    """Template text that runs ``query`` for the alert's run and renders ``body`` with its first sample as ``.``.

    ``query`` is a PromQL template (see ``fill``, which fills it with ``values``) in which ``${match}`` stands for
    the matchers of the alert's run: the selector (unless ``with_selector`` is false, for recorded series), every
    aggregation label and ``extra_labels`` equal to the alert's values. A label the alert lacks matches series
    without it.
    """
    names = (*c.aggregation_labels, *extra_labels)
    matchers = [c.selector.strip().replace("%", "%%")] if with_selector and c.selector.strip() else []
    matchers += [f"{name}=%q" for name in names]
    escaped = {name: value.replace("%", "%%") for name, value in values.items()}
    promql = fill(query.replace("%", "%%"), match=", ".join(matchers), **escaped)
    arguments = " ".join(f"$labels.{name}" for _ in range(query.count("${match}")) for name in names)
    return fill(
        "{{ with printf ${query} ${arguments} | query }}{{ with first . }}${body}{{ end }}{{ end }}",
        query=go_string(promql),
        arguments=arguments,
        body=body,
    )


def worst_recorded(c: Config, record: str, value_text: str) -> str:
    """The rank with the highest value of a per-rank recording rule in the alert's run."""
    return rank_lookup(
        c,
        "topk(1, ${record}{${match}})",
        fill("${rank} with ${value}", rank=RANK, value=value_text),
        with_selector=False,
        record=record,
    )


def top_site(c: Config, record: str, what: str) -> str:
    """A sentence naming the site (source line, and cause where the record has one) with the highest value of a
    per-run, per-site recording rule in the alert's run; nothing when the run has no site."""
    return rank_lookup(
        c,
        "topk(1, ${record}{${match}})",
        fill(
            ' Top site: {{ label "location" . }}{{ with label "cause" . }} ({{ . }}){{ end }}, '
            '{{ value . | printf "%.2f" }} ${what} per training step over the run\'s ranks.',
            what=what,
        ),
        with_selector=False,
        record=record,
    )


def first_to_stop(c: Config, state: str) -> str:
    """The rank in ``state`` whose last report is the oldest, in the alert's run."""
    return rank_lookup(
        c,
        "bottomk(1, max by (instance, rank, local_rank) (neuron_exporter_rank_last_report_timestamp_seconds{${match}})"
        " and on (instance, rank, local_rank) (max by (instance, rank, local_rank) "
        '(neuron_exporter_rank_state{${match}, state="${state}"}) == 1))',
        RANK,
        state=state,
    )


def most(c: Config, query: str, window: str, *extra_labels: str) -> str:
    """The rank of the alert's run with the highest count over ``window``, and the count: ``query`` as in
    ``rank_lookup``, with ``${window}``."""
    body = fill('${rank} ({{ value . | printf "%.0f" }})', rank=RANK)
    return rank_lookup(c, query, body, *extra_labels, window=window)


def alert(c: Config, name: str, for_: str, severity: str, expr: str, summary: str, description: str) -> dict:
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


# -- XLA training --------------------------------------------------------------------------------------------------


def xla_alerts(c: Config) -> list[dict]:
    """Per run: CPU-fallback operators, recompilations, graph cuts, host reads, compile time, stalled training."""
    run = labels(*c.run_labels)
    rank = labels(*c.rank_labels)
    the_run = run_name(c)

    def over(record: str, op: str, threshold: float) -> str:
        return fill(
            """
            count by (${run}) (
              ${record} ${op} ${threshold}
            )
            """,
            run=run,
            record=record,
            op=op,
            threshold=f"{threshold:g}",
        )

    return [
        alert(
            c,
            "XlaCpuFallbackOp",
            c.fallback_for,
            c.fallback_severity,
            expr=fill(
                """
                count by (${run_op}) (
                  sum by (${rank_op}) (increase(${fallback_ops}[${window}])) > 0
                )
                """,
                run_op=labels(*c.run_labels, "op"),
                rank_op=labels(*c.rank_labels, "op"),
                fallback_ops=select(c, "xla_cpu_fallback_ops_total"),
                window=c.fallback_window,
            ),
            summary=fill("Operator {{ $labels.op }} runs on the CPU in ${run_name}", run_name=the_run),
            description=fill(
                "{{ $labels.op }} has no XLA lowering: it ran on the CPU in the last ${window} in ${run_name}. "
                "Ranks affected: {{ $value }}; most calls: ${most_calls}. Every call cuts the graph and copies its "
                "tensors to the host and back. Every rank: the Fragmentation & recompiles dashboard.",
                window=c.fallback_window,
                run_name=the_run,
                most_calls=most(
                    c,
                    "topk(1, sum by (instance, rank, local_rank) "
                    "(increase(xla_cpu_fallback_ops_total{${match}}[${window}])))",
                    c.fallback_window,
                    "op",
                ),
            ),
        ),
        alert(
            c,
            "XlaRecompilationStorm",
            c.recompilation_for,
            c.recompilation_severity,
            expr=over(RECOMPILATIONS_PER_STEP, ">", c.recompilations_per_step),
            summary=fill("The graph keeps recompiling in ${run_name}", run_name=the_run),
            description=fill(
                "More than ${threshold} recompilations per training step after warm-up in ${run_name}. "
                "Ranks affected: {{ $value }}; worst: ${worst}.${top_site} Input shapes or Python values baked "
                "into the graph keep changing; neuron-exporter diagnose on a rank's endpoint names the upload "
                "whose shape changed. Every rank and site: the Fragmentation & recompiles dashboard.",
                threshold=f"{c.recompilations_per_step:g}",
                run_name=the_run,
                worst=worst_recorded(c, RECOMPILATIONS_PER_STEP, '{{ value . | printf "%.2f" }} per step'),
                top_site=top_site(c, SITE_RECOMPILATIONS_PER_STEP, "recompilations"),
            ),
        ),
        alert(
            c,
            "XlaGraphFragmentation",
            c.fragmentation_for,
            c.fragmentation_severity,
            expr=over(CUTS_PER_STEP, ">=", c.graph_cuts_per_step),
            summary=fill("Training steps are cut into several graphs in ${run_name}", run_name=the_run),
            description=fill(
                "At least ${threshold} graph cuts per training step in ${run_name}. Ranks affected: {{ $value }}; "
                "worst: ${worst}.${top_site} Something needs a device value before the step ends: .item(), print, "
                "an if on a tensor, .cpu() or a CPU-fallback operator. Every rank and site: the Fragmentation & "
                "recompiles dashboard.",
                threshold=f"{c.graph_cuts_per_step:g}",
                run_name=the_run,
                worst=worst_recorded(c, CUTS_PER_STEP, '{{ value . | printf "%.2f" }} cuts per step'),
                top_site=top_site(c, SITE_CUTS_PER_STEP, "cuts"),
            ),
        ),
        alert(
            c,
            "XlaFrequentHostReads",
            c.host_reads_for,
            c.host_reads_severity,
            expr=over(HOST_READS_PER_STEP, ">", c.host_reads_per_step),
            summary=fill("Device data is read on the host every step in ${run_name}", run_name=the_run),
            description=fill(
                "More than ${threshold} device-to-host transfers per training step in ${run_name}. Ranks affected: "
                "{{ $value }}; worst: ${worst}. Each read waits for the device and may cut the graph. Every rank: "
                "the Fragmentation & recompiles dashboard.",
                threshold=f"{c.host_reads_per_step:g}",
                run_name=the_run,
                worst=worst_recorded(c, HOST_READS_PER_STEP, '{{ value . | printf "%.2f" }} per step'),
            ),
        ),
        alert(
            c,
            "XlaCompileTimeDominates",
            c.compile_time_for,
            c.compile_time_severity,
            expr=over(COMPILE_TIME_SHARE, ">", c.compile_time_share),
            summary=fill("Compiling takes most of the step time in ${run_name}", run_name=the_run),
            description=fill(
                "Compilation takes more than ${share} of the step wall time in ${run_name}. Ranks affected: "
                "{{ $value }}; worst: ${worst}. Every rank: the Fragmentation & recompiles dashboard.",
                share=f"{c.compile_time_share:.0%}",
                run_name=the_run,
                worst=worst_recorded(c, COMPILE_TIME_SHARE, "{{ value . | humanizePercentage }}"),
            ),
        ),
        alert(
            c,
            "XlaTrainingStalled",
            c.stall_for,
            c.stall_severity,
            expr=fill(
                """
                count by (${run}) (
                  sum by (${rank}) (increase(${steps}[${window}])) == 0
                  unless on (${rank})
                  (max by (${rank}) (${hung_or_dead}) == 1)
                )
                """,
                run=run,
                rank=rank,
                steps=select(c, "xla_steps_total"),
                window=c.stall_window,
                hung_or_dead=select(c, "neuron_exporter_rank_state", 'state=~"hung|dead"'),
            ),
            summary=fill("Training has stalled in ${run_name}", run_name=the_run),
            description=fill(
                "No training step ended in the last ${window} in ${run_name}, while the metrics endpoints still "
                "answer. Ranks affected: {{ $value }}, for example ${example}.",
                window=c.stall_window,
                run_name=the_run,
                example=rank_lookup(
                    c,
                    "topk(1, sum by (instance, rank, local_rank) "
                    "(increase(xla_steps_total{${match}}[${window}])) == 0)",
                    RANK,
                    window=c.stall_window,
                ),
            ),
        ),
    ]


# -- torch.compile -------------------------------------------------------------------------------------------------


def torch_compile_alerts(c: Config) -> list[dict]:
    """torch.compile (dynamo), whatever the backend: recompilations that go on after warm-up, functions at the
    recompile limit, graph breaks found after warm-up. A rank is warmed up once its process has run for
    ``torch_compile_warmup_window``: its CPU-time counter existed that long ago and has not been reset since (a
    restarted process compiles afresh)."""
    the_run = run_name(c)
    window, warmup = c.torch_compile_window, c.torch_compile_warmup_window

    def after_warmup(metric: str) -> str:
        """The ranks of each run on which a counter gained over the window, once warmed up. A series that
        appeared within the window counts from 0 (a new line or reason is exported from its first count on,
        which increase() would miss)."""
        return fill(
            """
            count by (${run}) (
              (
                sum by (${rank}) (${counter})
                - (sum by (${rank}) (${counter} offset ${window}) or 0 * sum by (${rank}) (${counter}))
              ) > 0
              and on (${rank})
              (
                max by (${rank}) (${cpu} offset ${warmup})
                unless on (${rank})
                max by (${rank}) (resets(${cpu}[${warmup}])) > 0
              )
            )
            """,
            run=labels(*c.run_labels),
            rank=labels(*c.rank_labels),
            counter=select(c, metric),
            cpu=select(c, "xla_process_cpu_seconds_total"),
            window=window,
            warmup=warmup,
        )

    # What a counter gained over the window in the alert's run, per ``by`` (as in after_warmup).
    gained = (
        "topk(1, sum by (${by}) (${counter}{${match}}) - (sum by (${by}) (${counter}{${match}} offset ${window})"
        " or 0 * sum by (${by}) (${counter}{${match}})))"
    )

    def most_gained(metric: str, what: str) -> str:
        return rank_lookup(
            c,
            gained,
            fill('${rank} ({{ value . | printf "%.0f" }} ${what})', rank=RANK, what=what),
            by="instance, rank, local_rank",
            counter=metric,
            window=window,
        )

    def top_line(metric: str, what: str) -> str:
        return rank_lookup(
            c,
            gained,
            fill(
                ' Top line: {{ label "location" . }} ({{ label "reason" . }}), {{ value . | printf "%.0f" }} '
                "${what} in the last ${window} over the run's ranks.",
                what=what,
                window=window,
            ),
            by="location, reason",
            counter=metric,
            window=window,
        )

    return [
        alert(
            c,
            "TorchCompileRecompiling",
            c.torch_compile_recompile_for,
            c.torch_compile_recompile_severity,
            expr=after_warmup("torch_compile_recompilations_total"),
            summary=fill("torch.compile keeps recompiling after warm-up in ${run_name}", run_name=the_run),
            description=fill(
                "torch.compile recompiled functions after a guard failed, in every ${window} for ${for_}, on ranks "
                "that have run for more than ${warmup} in ${run_name}. Ranks affected: {{ $value }}; most "
                "recompilations: ${most}.${top_line} Each recompilation stops the step while dynamo and the backend "
                "compile. Every rank, function and line: the torch.compile dashboard; neuron-exporter diagnose on a "
                "rank's endpoint shows the guards that failed.",
                window=window,
                for_=c.torch_compile_recompile_for,
                warmup=warmup,
                run_name=the_run,
                most=most_gained("torch_compile_recompilations_total", "recompilations"),
                top_line=top_line("torch_compile_recompilations_total", "recompilations"),
            ),
        ),
        alert(
            c,
            "TorchCompileRecompileLimit",
            c.torch_compile_limit_for,
            c.torch_compile_limit_severity,
            expr=fill(
                """
                count by (${run_location}) (
                  sum by (${rank_location}) (${limit_hits}) > 0
                )
                """,
                run_location=labels(*c.run_labels, "location"),
                rank_location=labels(*c.rank_labels, "location"),
                limit_hits=select(c, "torch_compile_recompile_limit_hits_total"),
            ),
            summary=fill(
                "A function at {{ $labels.location }} hit torch.compile's recompile limit in ${run_name}",
                run_name=the_run,
            ),
            description=fill(
                "The function at {{ $labels.location }} recompiled torch._dynamo.config.recompile_limit times and "
                "runs without compiling from then on in ${run_name}. Ranks affected: {{ $value }}, for example "
                "${example}. Every rank, function and line: the torch.compile dashboard; neuron-exporter diagnose "
                "on a rank's endpoint shows the guards that failed.",
                run_name=the_run,
                example=rank_lookup(
                    c,
                    "topk(1, sum by (instance, rank, local_rank) (torch_compile_recompile_limit_hits_total{${match}}))",
                    RANK,
                    "location",
                ),
            ),
        ),
        alert(
            c,
            "TorchCompileGraphBreaks",
            c.torch_compile_graph_break_for,
            c.torch_compile_graph_break_severity,
            expr=after_warmup("torch_compile_graph_breaks_total"),
            summary=fill("torch.compile found new graph breaks after warm-up in ${run_name}", run_name=the_run),
            description=fill(
                "torch.compile broke graphs in the last ${window} on ranks that have run for more than ${warmup} "
                "in ${run_name}: a code path compiled late, or a recompilation that breaks. Ranks affected: "
                "{{ $value }}; most graph breaks: ${most}.${top_line} The code between two graphs runs eagerly at "
                "every call. Every rank, function and line: the torch.compile dashboard; neuron-exporter diagnose "
                "on a rank's endpoint shows dynamo's reason.",
                window=window,
                warmup=warmup,
                run_name=the_run,
                most=most_gained("torch_compile_graph_breaks_total", "graph breaks"),
                top_line=top_line("torch_compile_graph_breaks_total", "graph breaks"),
            ),
        ),
    ]


# -- the exporter --------------------------------------------------------------------------------------------------


def exporter_alerts(c: Config) -> list[dict]:
    """What the exporter sees of itself: hung and dead ranks, endpoints down, collection errors, the spool."""
    the_run = run_name(c)

    def ranks_in_state(state: str) -> str:
        return fill(
            """
            count by (${run}) (
              max by (${rank}) (${in_state}) == 1
            )
            """,
            run=labels(*c.run_labels),
            rank=labels(*c.rank_labels),
            in_state=select(c, "neuron_exporter_rank_state", f'state="{state}"'),
        )

    return [
        alert(
            c,
            "NeuronExporterRankHung",
            c.rank_hung_for,
            c.rank_hung_severity,
            expr=ranks_in_state("hung"),
            summary=fill("Ranks have stopped reporting in ${run_name}", run_name=the_run),
            description=fill(
                "The node endpoints mark ranks in ${run_name} as hung: their processes are alive but have reported "
                "no step within hung_after_seconds. Ranks affected: {{ $value }}; the first to stop: ${first}.",
                run_name=the_run,
                first=first_to_stop(c, "hung"),
            ),
        ),
        alert(
            c,
            "NeuronExporterRankDead",
            c.rank_dead_for,
            c.rank_dead_severity,
            expr=ranks_in_state("dead"),
            summary=fill("Rank processes are gone in ${run_name}", run_name=the_run),
            description=fill(
                "The node endpoints mark ranks in ${run_name} as dead: their processes exited without finishing. "
                "Ranks affected: {{ $value }}; the first to stop: ${first}. Their last counters stay visible until "
                "they expire.",
                run_name=the_run,
                first=first_to_stop(c, "dead"),
            ),
        ),
        alert(
            c,
            "NeuronExporterDown",
            c.exporter_down_for,
            c.exporter_down_severity,
            expr=fill("${up} == 0", up=select(c, "up")),
            summary="neuron-exporter endpoint {{ $labels.instance }} is down",
            description="Prometheus cannot scrape {{ $labels.instance }} (job {{ $labels.job }}): the training "
            "process or the node daemon is not serving /metrics.",
        ),
        alert(
            c,
            "NeuronExporterCollectionErrors",
            c.collection_errors_for,
            c.collection_errors_severity,
            expr=fill(
                """
                count by (${run_stage}) (
                  sum by (${rank_stage}) (increase(${errors}[${window}])) > 0
                )
                """,
                run_stage=labels(*c.run_labels, "stage"),
                rank_stage=labels(*c.rank_labels, "stage"),
                errors=select(c, "neuron_exporter_collection_errors_total"),
                window=c.collection_errors_window,
            ),
            summary=fill("neuron-exporter fails to collect ({{ $labels.stage }}) in ${run_name}", run_name=the_run),
            description=fill(
                "Collection errors at stage {{ $labels.stage }} in the last ${window} in ${run_name}. Ranks "
                "affected: {{ $value }}; most errors: ${most_errors}. The metrics of these ranks may be incomplete.",
                window=c.collection_errors_window,
                run_name=the_run,
                most_errors=most(
                    c,
                    "topk(1, sum by (instance, rank, local_rank) "
                    "(increase(neuron_exporter_collection_errors_total{${match}}[${window}])))",
                    c.collection_errors_window,
                    "stage",
                ),
            ),
        ),
        alert(
            c,
            "NeuronExporterCollectorFailing",
            c.collector_failing_for,
            c.collector_failing_severity,
            expr=fill(
                """
                count by (${run_collector}) (
                  min by (${rank_collector}) (${success}) == 0
                )
                """,
                run_collector=labels(*c.run_labels, "collector"),
                rank_collector=labels(*c.rank_labels, "collector"),
                success=select(c, "neuron_exporter_collector_success"),
            ),
            summary=fill("neuron-exporter collector {{ $labels.collector }} fails in ${run_name}", run_name=the_run),
            description=fill(
                "The last run of collector {{ $labels.collector }} failed in ${run_name}; its series are missing or "
                "stale. Ranks affected: {{ $value }}, for example ${example}.",
                run_name=the_run,
                example=rank_lookup(
                    c,
                    "topk(1, min by (instance, rank, local_rank) (neuron_exporter_collector_success{${match}}) == 0)",
                    RANK,
                    "collector",
                ),
            ),
        ),
        alert(
            c,
            "NeuronExporterSpoolFileRejected",
            c.spool_rejected_for,
            c.spool_rejected_severity,
            expr=fill(
                "max by (${labels}) (${rejected}) > 0",
                labels=labels(*c.aggregation_labels, "instance", "reason"),
                rejected=select(c, "neuron_exporter_spool_rejected_files"),
            ),
            summary="The node endpoint {{ $labels.instance }} refuses files in its spool directory "
            "({{ $labels.reason }})",
            description="Files in the spool directory of {{ $labels.instance }} that the node endpoint does not "
            "serve (reason {{ $labels.reason }}): {{ $value }}. Something wrote a file the endpoint does not trust, "
            "or the endpoint cannot read it; the ranks of those files are missing from the metrics. The endpoint "
            "logs each file once.",
        ),
        alert(
            c,
            "NeuronExporterSpoolDirectoryNotOk",
            c.spool_directory_for,
            c.spool_directory_severity,
            expr=fill(
                "min by (${labels}) (${directory_ok}) == 0",
                labels=labels(*c.aggregation_labels, "instance"),
                directory_ok=select(c, "neuron_exporter_spool_directory_ok"),
            ),
            summary="The node endpoint {{ $labels.instance }} does not read its spool directory",
            description="The spool directory of {{ $labels.instance }} is missing, or more open than spool_mode "
            "allows, or another user's: the node endpoint serves no rank from it. The endpoint logs the reason once.",
        ),
    ]


# -- rule files ----------------------------------------------------------------------------------------------------

ALERT_GROUPS: dict[str, Callable[[Config], list[dict]]] = {
    XLA_GROUP: xla_alerts,
    TORCH_COMPILE_GROUP: torch_compile_alerts,
    EXPORTER_GROUP: exporter_alerts,
}


def alert_rules(c: Config = DEFAULTS) -> list[dict]:
    """Every alert, group after group."""
    return [rule for alerts in ALERT_GROUPS.values() for rule in alerts(c)]


def rule_files(c: Config = DEFAULTS) -> dict[str, dict]:
    """{file name: rule file content} for the two files Prometheus loads."""
    recording = [{"record": name, "expr": expr} for name, expr in recording_rules(c).items()]
    return {
        RECORDING_FILE: {"groups": [{"name": RECORDING_GROUP, "rules": recording}]},
        ALERTS_FILE: {"groups": [{"name": name, "rules": alerts(c)} for name, alerts in ALERT_GROUPS.items()]},
    }


RECORDING_RULES = recording_rules(DEFAULTS)  # the default expressions, by name
