"""The "Exporter health" row: endpoints up, collectors, collection errors, rank states, the exporter's own cost, memory,
and spool problems."""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard, Row
from grafana_foundation_sdk.models import dashboard as model

from ....catalogue import (
    COLLECTION_ERRORS,
    COLLECTOR_SUCCESS,
    PROCESS_MEMORY,
    RANK_LAST_REPORT,
    RANK_STATE,
    SPOOL_DIRECTORY_OK,
    SPOOL_REJECTED,
    STEP_HOOK_SECONDS,
    XLA_STEP_DURATION,
)
from ...config import Config
from ..panels import RANK_LEGEND, Queries, graph, instant_table, single_stat


def row(board: Dashboard, c: Config, q: Queries) -> Dashboard:
    ok = model.ValueMap(
        options={
            "0": model.ValueMappingResult(text="failing", color="red", index=0),
            "1": model.ValueMappingResult(text="ok", color="green", index=1),
        }
    )
    return (
        board.with_row(Row("Exporter health"))
        .with_panel(
            single_stat(
                "Endpoints up",
                "Scrape targets of the selected job and instances that answered the last scrape.",
                "short",
                f"sum(up{{{q.target}}})",
                width=4,
                height=8,
            )
        )
        .with_panel(
            single_stat(
                "Collector success",
                "Whether each collector of the exporter succeeded on its last run.",
                "none",
                f"min by (collector) ({COLLECTOR_SUCCESS.name}{{{q.target}}})",
                steps=((None, "red"), (1, "green")),
                legend="{{collector}}",
                width=8,
                height=8,
                mappings=[ok],
            )
        )
        .with_panel(
            graph(
                "Collection errors",
                "Errors inside the exporter's collection code per interval, by stage "
                "(step, scrape, spool). The training loop is never interrupted by them.",
                "short",
                (
                    f"sum by (stage) (increase({COLLECTION_ERRORS.name}{{{q.target}}}[$__rate_interval]))",
                    "{{stage}}",
                ),
            )
        )
        .with_panel(
            instant_table(
                "Rank state",
                "State of every rank the node endpoint knows (running, hung or dead), its run, and "
                "the time since it last reported.",
                "s",
                f"(time() - max by (run_id, rank, local_rank) "
                f"({RANK_LAST_REPORT.name}{{{q.rank}}}))"
                f" * on (run_id, rank, local_rank) group_left (state)"
                f" (max by (run_id, rank, local_rank, state) ({RANK_STATE.name}{{{q.rank}}}) == 1)",
                {"run_id": "Run", "rank": "Rank", "local_rank": "Local rank", "state": "State"},
                "Since last report",
                width=24,
                height=6,
            )
        )
        .with_panel(
            graph(
                "Exporter share of step time",
                "Time the exporter spends in its step hook, as a share of each "
                "rank's step wall time: the monitoring overhead.",
                "percentunit",
                (q.ratio(STEP_HOOK_SECONDS.name, f"{XLA_STEP_DURATION.name}_sum"), RANK_LEGEND),
                width=8,
            )
        )
        .with_panel(
            graph(
                "Resident memory by rank",
                "Resident set size of each training process.",
                "bytes",
                (f"sum by (run_id, rank) ({PROCESS_MEMORY.name}{{{q.rank}}})", RANK_LEGEND),
                width=8,
            )
        )
        .with_panel(
            graph(
                "Spool problems",
                "Rank files in the spool directory that the node endpoint refuses, by reason "
                "(see its log), and node endpoints that cannot read their spool directory (1). Both should be 0.",
                "short",
                (
                    f"max by (instance, reason) ({SPOOL_REJECTED.name}{{{q.target}}})",
                    "rejected files: {{reason}}, {{instance}}",
                ),
                (
                    f"max by (instance) (1 - {SPOOL_DIRECTORY_OK.name}{{{q.target}}})",
                    "directory not read, {{instance}}",
                ),
                width=8,
            )
        )
    )
