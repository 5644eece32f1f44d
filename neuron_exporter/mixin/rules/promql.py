"""What the rules are written with: ``fill`` for PromQL and Go-template text in which ``${name}`` stands for what
the configuration decides, the selector and label lists, and the annotation templates that name an alert's run,
its worst rank and its top site (template queries run when the alert fires)."""

from __future__ import annotations

import re
import textwrap

from ...catalogue import RANK_LAST_REPORT, RANK_STATE
from ..config import Config

# The rank an alert's description names, from the first sample of a template query.
RANK = 'rank {{ label "rank" . }} (local rank {{ label "local_rank" . }}) of {{ label "instance" . }}'

PLACEHOLDER = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
DURATION_PART = re.compile(r"([0-9]+)(ms|s|m|h|d|w|y)")
SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}


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


def duration_seconds(duration: str) -> float:
    """A Prometheus duration (``15m``, ``1h30m``) in seconds."""
    return sum(int(number) * SECONDS[unit] for number, unit in DURATION_PART.findall(duration))


def labels(*names: str) -> str:
    """A label list for by/on: each name once, in order."""
    return ", ".join(dict.fromkeys(names))


def select(c: Config, metric: str, *matchers: str) -> str:
    """``metric{selector, matchers}`` (no braces when there is nothing to match)."""
    inside = ", ".join(m for m in (c.selector.strip(), *matchers) if m)
    return f"{metric}{{{inside}}}" if inside else metric


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


def rank_lookup(
    c: Config,
    query: str,
    body: str,
    *extra_labels: str,
    with_selector: bool = True,
    otherwise: str = "",
    **values: str,
) -> str:
    """Template text that runs ``query`` for the alert's run and renders ``body`` with its first sample as ``.``, or
    ``otherwise`` when the query finds nothing.

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
        "{{ with printf ${query} ${arguments} | query }}{{ with first . }}${body}{{ end }}${otherwise}{{ end }}",
        query=go_string(promql),
        arguments=arguments,
        body=body,
        otherwise="{{ else }}" + otherwise if otherwise else "",
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
        "bottomk(1, max by (instance, rank, local_rank) (${last_report}{${match}})"
        " and on (instance, rank, local_rank) (max by (instance, rank, local_rank) "
        '(${states}{${match}, state="${state}"}) == 1))',
        RANK,
        state=state,
        last_report=RANK_LAST_REPORT.name,
        states=RANK_STATE.name,
    )


def most(c: Config, query: str, window: str, *extra_labels: str, **values: str) -> str:
    """The rank of the alert's run with the highest count over ``window``, and the count: ``query`` as in
    ``rank_lookup``, with ``${window}``."""
    body = fill('${rank} ({{ value . | printf "%.0f" }})', rank=RANK)
    return rank_lookup(c, query, body, *extra_labels, with_selector=True, window=window, **values)


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
