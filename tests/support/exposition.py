"""Scraping an endpoint and reading an exposition."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def scrape(url: str, timeout: float = 10.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read().decode()


def samples(exposition: str) -> dict[tuple[str, frozenset], float]:
    """{(sample name, frozenset of label items): value} for every sample of an exposition."""
    result = {}
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            result[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return result


def series(exposition: str, name: str) -> dict[tuple, float]:
    """{(label values but the rank's own labels (run_id, rank, local_rank), sorted by label name): value} of one
    family."""
    found = {}
    for (sample, labels), v in samples(exposition).items():
        if sample == name:
            found[tuple(value for key, value in sorted(labels) if key not in ("rank", "local_rank", "run_id"))] = v
    return found


def value(exposition: str, name: str, **labels: str) -> float | None:
    """The value of the one sample called ``name`` whose labels include ``labels``; None if there is none."""
    found = [v for (n, ls), v in samples(exposition).items() if n == name and set(labels.items()) <= ls]
    assert len(found) <= 1, f"{name}{labels} matches {len(found)} series"
    return found[0] if found else None


def total(exposition: str, name: str, **labels: str) -> float:
    """The sum of every sample called ``name`` whose labels include ``labels`` (0 if there is none)."""
    return sum(v for (n, ls), v in samples(exposition).items() if n == name and set(labels.items()) <= ls)


RANK_LABELS = {"run_id", "rank", "local_rank"}


def uncatalogued(exposition: str, check_help: bool = True) -> list[str]:
    """The exporter's families in an exposition (named with its prefixes) that the catalogue lacks, or lists with
    another type, other labels or (``check_help``) another HELP; one line each."""
    from neuron_exporter.catalogue import DAEMON_BUILD_INFO, FAMILIES

    wrong = []
    for found in text_string_to_metric_families(exposition):
        name = f"{found.name}_total" if found.type == "counter" else found.name
        if not name.startswith(("xla_", "training_", "torch_compile_", "torchneuron_", "neuron_exporter_")):
            continue
        family = FAMILIES.get(name)
        labels = {key for sample in found.samples for key in sample.labels} - {"le"}
        if family is not None and family.name == DAEMON_BUILD_INFO.name and not labels & RANK_LABELS:
            family = DAEMON_BUILD_INFO
        if family is None:
            wrong.append(f"{name}: not in the catalogue")
            continue
        expected = set(family.labels) | (RANK_LABELS if family.per_rank else set())
        if found.type != family.type or (found.samples and labels != expected):
            wrong.append(f"{name}: {found.type} {sorted(labels)}, the catalogue: {family.type} {sorted(expected)}")
        if check_help and found.documentation != family.help:
            wrong.append(f"{name}: HELP {found.documentation!r}, the catalogue: {family.help!r}")
    return wrong
