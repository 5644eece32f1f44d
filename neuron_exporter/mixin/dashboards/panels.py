"""Small builders shared by the dashboards: every data panel gets a unit, a description and queries that go
through the ``$datasource`` variable; ``Queries`` holds the label matchers of the configuration's selector and
the dashboard variables."""

from __future__ import annotations

from grafana_foundation_sdk.builders import common, dashboard, prometheus, stat, table, text, timeseries
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.models import common as common_model
from grafana_foundation_sdk.models import dashboard as model
from grafana_foundation_sdk.models import prometheus as prom_model
from grafana_foundation_sdk.models.common import DataSourceRef

from ...catalogue import BUILD_INFO, TRAINING_STEPS, XLA_FALLBACK_OPS, XLA_STEPS
from ..config import Config
from ..device_layer import DEVICE_JOB_SERIES

DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")

# Per-rank panels group by run and rank; their legends name both (an empty run_id shows nothing).
BY_RANK = "run_id, rank"
RANK_LEGEND = "rank {{rank}} {{run_id}}"
BY_RUN = "job, run_id"
RUN_LEGEND = "{{job}} {{run_id}}"


class Queries:
    """Label matchers and query builders for one configuration: the selector, then the dashboard variables.

    ``target``: series of the selected endpoints (cluster, namespace, job, instance); ``run``: also of the
    selected runs; ``rank``: also of the selected ranks. ``device``: the device layer's series (``device_layer``),
    of their own selector and job, since their namespace and instance are their monitor's.
    """

    def __init__(self, c: Config):
        self.selector = c.selector.strip()
        base = [self.selector] if self.selector else []
        self.scope = ", ".join(base + ['cluster=~"$cluster"', 'namespace=~"$namespace"', 'job=~"$job"'])
        self.target = self.scope + ', instance=~"$instance"'
        self.run = self.target + ', run_id=~"$run_id"'
        self.rank = self.run + ', rank=~"$rank"'
        device_selector = c.device_selector.strip()
        self.device_scope = ", ".join(([device_selector] if device_selector else []) + ['cluster=~"$cluster"'])
        self.device = self.device_scope + ', job=~"$device_job"'

    def rate(
        self, metric: str, by: str = BY_RANK, matchers: str | None = None, window: str = "$__rate_interval"
    ) -> str:
        """``sum by (by) (rate(metric{matchers}[window]))``; ``by=""`` sums over everything."""
        grouping = f" by ({by})" if by else ""
        return f"sum{grouping} (rate({metric}{{{matchers or self.rank}}}[{window}]))"

    def ratio(self, numerator: str, denominator: str, by: str = BY_RANK, matchers: str | None = None) -> str:
        """rate(numerator) / rate(denominator), both summed by ``by``."""
        return f"{self.rate(numerator, by, matchers)} / {self.rate(denominator, by, matchers)}"

    def increase(self, metric: str, by: str, window: str = "$__range", matchers: str | None = None) -> str:
        return f"sum by ({by}) (increase({metric}{{{matchers or self.rank}}}[{window}]))"

    # Per site (or operator) of each run, over the time range: ``by`` is "cause, location", "location" or "op".
    def per_run_step(self, metric: str, by: str, matchers: str | None = None, steps: str = XLA_STEPS.name) -> str:
        """A site's events per training step of its run in the time range, where it had any: summed over the
        selected ranks and divided by the run's training steps (``steps``: torch_xla's, or ``training_steps_total``
        of every backend) summed over the same ranks, so the sites of a run add up to the run's own ratio."""
        return (
            f"{self.increase(metric, f'run_id, {by}', matchers=matchers)} / on (run_id) group_left "
            f"sum by (run_id) (increase({steps}{{{self.rank}}}[$__range]) > 0) > 0"
        )

    def ranks_with(self, metric: str, by: str, matchers: str | None = None) -> str:
        """How many of the selected ranks of each run counted a site's events in the time range."""
        return f"count by (run_id, {by}) ({self.increase(metric, f'run_id, rank, {by}', matchers=matchers)} > 0)"


REF_IDS = "ABCDEFGHIJ"


def query(expr: str, legend: str = "", ref: str = "A") -> prometheus.Dataquery:
    q = prometheus.Dataquery().expr(expr).ref_id(ref).datasource(DATASOURCE)
    return q.legend_format(legend) if legend else q


def instant_table_query(expr: str, ref: str = "A") -> prometheus.Dataquery:
    return (
        prometheus.Dataquery()
        .expr(expr)
        .ref_id(ref)
        .datasource(DATASOURCE)
        .instant()
        .format(prom_model.PromQueryFormat.TABLE)
    )


def _targets(panel, queries):
    for ref, (expr, legend) in zip(REF_IDS, queries, strict=False):
        panel = panel.with_target(query(expr, legend, ref))
    return panel


def thresholds(*steps: tuple[float | None, str]) -> dashboard.ThresholdsConfig:
    return (
        dashboard.ThresholdsConfig()
        .mode(model.ThresholdsMode.ABSOLUTE)
        .steps([model.Threshold(value=value, color=color) for value, color in steps])
    )


def graph(
    title: str,
    description: str,
    unit: str,
    *queries: tuple[str, str],
    width: int = 12,
    height: int = 8,
    stacked: bool = False,
    min_value: float | None = 0,
    threshold: float | None = None,
) -> timeseries.Panel:
    """A time series panel; ``queries`` are (expr, legend) pairs."""
    panel = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .unit(unit)
        .datasource(DATASOURCE)
        .span(width)
        .height(height)
        .line_width(1)
        .fill_opacity(10)
        .legend(
            common.VizLegendOptions()
            .display_mode(common_model.LegendDisplayMode.LIST)
            .placement(common_model.LegendPlacement.BOTTOM)
            .show_legend(True)
        )
    )
    if min_value is not None:
        panel = panel.min(min_value)
    if stacked:
        panel = panel.stacking(common.StackingConfig().mode(common_model.StackingMode.NORMAL))
    if threshold is not None:
        panel = panel.thresholds(thresholds((None, "green"), (threshold, "red"))).thresholds_style(
            common.GraphThresholdsStyleConfig().mode(common_model.GraphThresholdsStyleMode.DASHED)
        )
    return _targets(panel, queries)


def single_stat(
    title: str,
    description: str,
    unit: str,
    expr: str,
    steps: tuple = ((None, "green"),),
    legend: str = "",
    width: int = 4,
    height: int = 4,
    mappings: list | None = None,
    instant: bool = False,
) -> stat.Panel:
    """A stat panel showing the last value of each series, coloured by ``steps`` ((from value, colour) pairs).
    ``instant``: one query at the end of the time range, for a value whose query is too costly to run at every step
    of a range and that has no use for them."""
    target = query(expr, legend)
    panel = (
        stat.Panel()
        .title(title)
        .description(description)
        .unit(unit)
        .datasource(DATASOURCE)
        .span(width)
        .height(height)
        .thresholds(thresholds(*steps))
        .reduce_options(common.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
        .color_mode(common_model.BigValueColorMode.BACKGROUND)
        .graph_mode(common_model.BigValueGraphMode.NONE)
        .with_target(target.instant() if instant else target)
    )
    return panel.mappings(mappings) if mappings else panel


def instant_table(
    title: str,
    description: str,
    unit: str,
    expr: str,
    columns: dict[str, str],
    value_header: str,
    width: int = 12,
    height: int = 8,
) -> table.Panel:
    """A table of one instant query: ``columns`` maps the labels to show, in order, to their headers; the
    value column is called ``value_header`` and sorted descending."""
    names = [*columns, "Value"]
    keep = model.DataTransformerConfig(id_val="filterFieldsByName", options={"include": {"names": names}})
    organize = model.DataTransformerConfig(
        id_val="organize",
        options={
            "indexByName": {name: i for i, name in enumerate(names)},
            "renameByName": {**columns, "Value": value_header},
        },
    )
    return (
        table.Panel()
        .title(title)
        .description(description)
        .unit(unit)
        .datasource(DATASOURCE)
        .span(width)
        .height(height)
        .with_target(instant_table_query(expr))
        .with_transformation(keep)
        .with_transformation(organize)
        .sort_by([table_sort(value_header)])
    )


def merged_table(
    title: str,
    description: str,
    unit: str,
    columns: dict[str, str],
    *values: tuple[str, str, str | None],
    width: int = 12,
    height: int = 8,
    limit: int | None = None,
) -> table.Panel:
    """A table of several instant queries joined on their labels, one row per label set: ``columns`` maps the
    labels to show, in order, to their headers; ``values`` are (expr, header, unit) triples, one column each (unit
    None: the panel's ``unit``). Sorted by the first value column, descending; ``limit`` keeps the first rows."""
    names = {f"Value #{ref}": header for ref, (_, header, _) in zip(REF_IDS, values, strict=False)}
    order = [*columns, *names]
    first = values[0][1]
    panel = (
        table.Panel()
        .title(title)
        .description(description)
        .unit(unit)
        .datasource(DATASOURCE)
        .span(width)
        .height(height)
        .with_transformation(model.DataTransformerConfig(id_val="merge", options={}))
        .with_transformation(
            model.DataTransformerConfig(id_val="filterFieldsByName", options={"include": {"names": order}})
        )
        .with_transformation(
            model.DataTransformerConfig(
                id_val="organize",
                options={
                    "indexByName": {name: i for i, name in enumerate(order)},
                    "renameByName": {**columns, **names},
                },
            )
        )
        .sort_by([table_sort(first)])
    )
    if limit is not None:
        panel = panel.with_transformation(
            model.DataTransformerConfig(id_val="sortBy", options={"sort": [{"field": first, "desc": True}]})
        ).with_transformation(model.DataTransformerConfig(id_val="limit", options={"limitField": limit}))
    for ref, (expr, header, column_unit) in zip(REF_IDS, values, strict=False):
        panel = panel.with_target(instant_table_query(expr, ref))
        if column_unit is not None:
            panel = panel.override_by_name(header, [model.DynamicConfigValue(id_val="unit", value=column_unit)])
    return panel


def table_sort(field: str) -> common.TableSortByFieldState:
    return common.TableSortByFieldState().display_name(field).desc(True)


def note(title: str, description: str, markdown: str, width: int = 24, height: int = 7) -> text.Panel:
    """A text panel explaining a row: what the signal means and what to do."""
    return text.Panel().title(title).description(description).content(markdown.strip()).span(width).height(height)


def variables(
    board: dashboard.Dashboard, q: Queries, with_op: bool = False, with_device: bool = False
) -> dashboard.Dashboard:
    """The datasource, cluster, namespace, job, run, instance and rank variables (and op, for drill-down by
    operator; device_job, the jobs of the device layer's series, for the device rows). A label the series do not
    have lists no value, and "All" (.*) matches its absence."""
    base = f"{q.selector}, " if q.selector else ""
    place = f'{base}cluster=~"$cluster", namespace=~"$namespace"'
    board = (
        board.with_variable(dashboard.DatasourceVariable("datasource").label("Data source").type("prometheus"))
        .with_variable(
            label_variable("cluster", "Cluster", f"label_values({BUILD_INFO.name}{{{q.selector}}}, cluster)")
        )
        .with_variable(
            label_variable(
                "namespace",
                "Namespace",
                f'label_values({BUILD_INFO.name}{{{base}cluster=~"$cluster"}}, namespace)',
            )
        )
        .with_variable(label_variable("job", "Job", f"label_values({BUILD_INFO.name}{{{place}}}, job)", multi=False))
        # Runs and ranks of every backend: training_steps_total is served by every attached process.
        .with_variable(label_variable("run_id", "Run", f"label_values({TRAINING_STEPS.name}{{{q.scope}}}, run_id)"))
        .with_variable(
            label_variable(
                "instance", "Instance", f'label_values({TRAINING_STEPS.name}{{{q.scope}, run_id=~"$run_id"}}, instance)'
            )
        )
        .with_variable(label_variable("rank", "Rank", f"label_values({TRAINING_STEPS.name}{{{q.run}}}, rank)"))
    )
    if with_op:
        board = board.with_variable(
            label_variable("op", "Operator", f"label_values({XLA_FALLBACK_OPS.name}{{{q.rank}}}, op)")
        )
    if with_device:
        series = f'{{__name__=~"{DEVICE_JOB_SERIES}", {q.device_scope}}}'
        board = board.with_variable(label_variable("device_job", "Device job", f"label_values({series}, job)"))
    return board


def label_variable(name: str, label: str, query_text: str, multi: bool = True) -> dashboard.QueryVariable:
    variable = (
        dashboard.QueryVariable(name)
        .label(label)
        .datasource(DATASOURCE)
        .query(query_text)
        .refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(model.VariableSort.NATURAL_ASC)
    )
    if multi:
        variable = (
            variable.multi(True)
            .include_all(True)
            .all_value(".*")
            .current(model.VariableOption(selected=True, text="All", value="$__all"))
        )
    return variable


def finish(board: dashboard.Dashboard) -> model.Dashboard:
    """Build the dashboard and number its panels (rows included) in layout order."""
    built = board.build()
    for number, panel in enumerate(built.panels or [], start=1):
        panel.id_val = number
    return built


def dashboard_links() -> list[cogbuilder.Builder[model.DashboardLink]]:
    """A drop-down to the other neuron-exporter dashboards, carrying the time range and the variables."""
    return [
        dashboard.DashboardLink("neuron-exporter")
        .type(model.DashboardLinkType.DASHBOARDS)
        .tags(["neuron-exporter"])
        .as_dropdown(True)
        .include_vars(True)
        .keep_time(True)
    ]
