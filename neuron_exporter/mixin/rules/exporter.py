"""The alerts of the exporter itself: hung and dead ranks, endpoints down, collection errors, the spool."""

from __future__ import annotations

from ...catalogue import COLLECTION_ERRORS, COLLECTOR_SUCCESS, RANK_STATE, SPOOL_DIRECTORY_OK, SPOOL_REJECTED
from ..config import Config
from .promql import RANK, alert, fill, first_to_stop, labels, most, rank_lookup, run_name, select


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
            in_state=select(c, RANK_STATE.name, f'state="{state}"'),
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
                errors=select(c, COLLECTION_ERRORS.name),
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
                    "topk(1, sum by (instance, rank, local_rank) (increase(${errors}{${match}}[${window}])))",
                    c.collection_errors_window,
                    "stage",
                    errors=COLLECTION_ERRORS.name,
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
                success=select(c, COLLECTOR_SUCCESS.name),
            ),
            summary=fill("neuron-exporter collector {{ $labels.collector }} fails in ${run_name}", run_name=the_run),
            description=fill(
                "The last run of collector {{ $labels.collector }} failed in ${run_name}; its series are missing or "
                "stale. Ranks affected: {{ $value }}, for example ${example}.",
                run_name=the_run,
                example=rank_lookup(
                    c,
                    "topk(1, min by (instance, rank, local_rank) (${success}{${match}}) == 0)",
                    RANK,
                    "collector",
                    success=COLLECTOR_SUCCESS.name,
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
                rejected=select(c, SPOOL_REJECTED.name),
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
                directory_ok=select(c, SPOOL_DIRECTORY_OK.name),
            ),
            summary="The node endpoint {{ $labels.instance }} does not read its spool directory",
            description="The spool directory of {{ $labels.instance }} is missing, or more open than spool_mode "
            "allows, or another user's: the node endpoint serves no rank from it. The endpoint logs the reason once.",
        ),
    ]
