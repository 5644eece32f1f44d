"""A strict check of a rank's exposition before the node endpoint serves it.

A rank file is written by a training process, but anyone who can write to the spool directory can put one there.
The node endpoint serves a rank only if its exposition is what a rank writes: the text format 0.0.4 as
prometheus_client renders it, line by line; only the exporter's own families, never one the node endpoint owns
(``neuron_exporter_rank_up`` and the like); every sample labelled with the rank and local rank of the file's
header (and its run), so a file cannot speak for another rank. One bad line and the whole rank is left out: a single
malformed line would make Prometheus reject the whole node's scrape.

A rank rewrites its file every couple of seconds, usually with new values only. ``recheck`` compares a rewrite with
the last checked exposition of the same file line by line: if every line but the sample values is the same, only the
values are checked. Anything else gets the full check.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from .. import catalogue
from ..untrusted import printable

NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"')
LABELS = re.compile(rf"{LABEL.pattern}(?:,{LABEL.pattern})*,?")
SAMPLE = re.compile(rf"({NAME})(?:\{{(.*)\}})? ([^ ]+)")  # no timestamp: the endpoint serves the samples as now
VALUE_PATTERN = r"[+-]?(?:Inf|NaN|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)"
VALUE = re.compile(VALUE_PATTERN)
VALUE_BYTES = re.compile(VALUE_PATTERN.encode())
HELP = re.compile(rf"# HELP ({NAME}) (?:[^\\\n]|\\[\\n])*")
TYPE = re.compile(rf"# TYPE ({NAME}) (?:counter|gauge|histogram|summary|untyped)")
SAMPLE_SUFFIXES = ("", "_bucket", "_sum", "_count", "_created")
# A family named like a histogram's sample (``x_count``, ``x_bucket``) makes Prometheus' parsers see a second HELP
# line for ``x`` once the ranks are merged: a rank may not declare one. (``x_created`` gauges are how prometheus_client
# writes creation times in this format.)
RESERVED_SUFFIXES = ("_bucket", "_sum", "_count")


def _rank_prefixes() -> tuple[str, ...]:
    """The namespaces of the catalogue's per-rank families (``xla_``, ``training_``, ...): a family's first word, or
    its first two where a node family starts with the same word (``neuron_exporter_``)."""
    node_words = {family.name.split("_")[0] for family in catalogue.FAMILIES.values() if not family.per_rank}
    prefixes = set()
    for family in catalogue.FAMILIES.values():
        if family.per_rank and family.owner != catalogue.NODE:
            words = family.name.split("_")
            prefixes.add("_".join(words[: 2 if words[0] in node_words else 1]) + "_")
    return tuple(sorted(prefixes))


RANK_PREFIXES = _rank_prefixes()  # what a rank file may publish: a new family's namespace is its catalogue entry
# Families the node endpoint itself renders: a rank file must not publish them.
NODE_FAMILIES = tuple(family.name for family in catalogue.FAMILIES.values() if family.owner == catalogue.NODE)
NODE_PREFIXES = ("neuron_exporter_host_", "neuron_exporter_spool_")
SHOWN = 60  # characters of an offending line quoted in an error


class ExpositionError(ValueError):
    """Why an exposition is not served; ``str()`` is one line naming the line."""


@dataclass(frozen=True)
class CheckedExposition:
    """An exposition that passed the check, with what a recheck of its next version compares against."""

    text: bytes
    skeleton: bytes  # a digest of every line, sample lines without their value (a digest: a node holds 128 of them)


def skeleton_and_values(exposition: bytes) -> tuple[bytes, list[bytes]]:
    """A digest of the lines of ``exposition`` with each sample line cut before its value, and the sample values."""
    skeleton, values = [], []
    for line in exposition.split(b"\n"):
        if not line or line[:1] == b"#":
            skeleton.append(line)
        else:
            prefix, _, sample_value = line.rpartition(b" ")
            skeleton.append(prefix)
            values.append(sample_value)
    return hashlib.sha256(b"\n".join(skeleton)).digest(), values


def recheck(
    exposition: bytes, previous: CheckedExposition | None, rank: str, local_rank: str, run_id: str
) -> CheckedExposition:
    """``exposition`` checked, by its values only when everything else is the same as ``previous`` (the same file's
    last checked exposition, for the same rank and run); ``ExpositionError`` if it is not served."""
    skeleton, values = skeleton_and_values(exposition)
    if previous is None or skeleton != previous.skeleton or not all(map(VALUE_BYTES.fullmatch, values)):
        check_exposition(exposition, rank, local_rank, run_id)
    return CheckedExposition(exposition, skeleton)


def escape_label_value(value: str) -> str:
    """A label value as the text format writes it."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def is_rank_family(name: str) -> bool:
    return name.startswith(RANK_PREFIXES) and name not in NODE_FAMILIES and not name.startswith(NODE_PREFIXES)


def _belongs(sample: str, family: str) -> bool:
    if family.endswith("_total") and sample == family[: -len("_total")] + "_created":
        return True
    return any(sample == family + suffix for suffix in SAMPLE_SUFFIXES)


def check_exposition(exposition: bytes, rank: str, local_rank: str, run_id: str) -> None:
    """Raise ``ExpositionError`` unless ``exposition`` is a rank's own: every series of ``run_id``, ``rank`` and
    ``local_rank``."""
    try:
        text = exposition.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ExpositionError(f"not UTF-8 (byte {error.start})") from None
    if text and not text.endswith("\n"):
        raise ExpositionError("the last line has no line end (a truncated file?)")
    family = None
    seen: set[str] = set()
    run = escape_label_value(run_id)
    for number, line in enumerate(text.split("\n")[:-1], start=1):
        where = f"exposition line {number}"
        if line.startswith("# HELP "):
            match = HELP.fullmatch(line)
            if not match:
                raise ExpositionError(f"{where}: malformed HELP line: {printable(line, SHOWN)}")
            family = match.group(1)
            if not is_rank_family(family) or family.endswith(RESERVED_SUFFIXES):
                raise ExpositionError(f"{where}: {printable(family, SHOWN)} is not a family a rank may publish")
            if family in seen:
                raise ExpositionError(f"{where}: family {family} appears twice")
            seen.add(family)
        elif line.startswith("# TYPE "):
            match = TYPE.fullmatch(line)
            if not match or match.group(1) != family:
                raise ExpositionError(f"{where}: TYPE line does not follow its HELP line: {printable(line, SHOWN)}")
        else:
            match = SAMPLE.fullmatch(line)
            if not match or not VALUE.fullmatch(match.group(3)):
                raise ExpositionError(f"{where}: malformed line: {printable(line, SHOWN)}")
            if family is None or not _belongs(match.group(1), family):
                raise ExpositionError(f"{where}: sample outside its family: {printable(line, SHOWN)}")
            body = match.group(2) or ""
            if body and not LABELS.fullmatch(body):
                raise ExpositionError(f"{where}: malformed labels: {printable(line, SHOWN)}")
            pairs = LABEL.findall(body)
            labels = dict(pairs)
            if len(labels) != len(pairs) or any(name.startswith("__") for name in labels):
                # Prometheus refuses the whole scrape for one such sample: every rank of the node would go.
                raise ExpositionError(f"{where}: a label name repeated or reserved (__): {printable(line, SHOWN)}")
            if labels.get("rank") != rank or labels.get("local_rank") != local_rank or labels.get("run_id") != run:
                raise ExpositionError(
                    f"{where}: a series of another rank in the file of rank {rank} of run {run_id}: "
                    + printable(line, SHOWN)
                )
