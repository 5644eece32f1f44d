"""``/metrics?name[]=...``: only the samples of the names given, as prometheus_client's own endpoint selects them.

A name is a sample's name (``steps_total``, ``step_seconds_bucket``): a family is served with its samples of those
names, and left out if it has none.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric


class SelectedCollector:
    """The samples of ``names`` in what ``source.collect()`` gives, whatever collector it is."""

    def __init__(self, source: object, names: frozenset[str]):
        self._source = source
        self._names = names

    def collect(self) -> Iterator[Metric]:
        for metric in self._source.collect():  # type: ignore[attr-defined]
            samples = [sample for sample in metric.samples if sample.name in self._names]
            if samples:
                selected = Metric(metric.name, metric.documentation, metric.type, metric.unit)
                selected.samples = samples
                yield selected


def select_text(text: bytes, names: frozenset[str]) -> bytes:
    """The lines of a text exposition (format 0.0.4) that ``names`` select: their samples, and the HELP and TYPE
    lines of the families they are in."""
    wanted = {name.encode() for name in names}
    out: list[bytes] = []
    family, shown = b"", False  # the family of the last HELP or TYPE line; whether its lines are out
    metadata: list[bytes] = []  # its HELP and TYPE lines while they are not
    for line in text.split(b"\n"):
        if line.startswith((b"# HELP ", b"# TYPE ")):
            name = line[7:].split(b" ", 1)[0]
            if name != family:
                family, metadata, shown = name, [], False
            if shown:
                out.append(line)
            else:
                metadata.append(line)
        elif line and not line.startswith(b"#"):
            if line.split(b"{", 1)[0].split(b" ", 1)[0] in wanted:
                if not shown:
                    out.extend(metadata)
                    shown = True
                out.append(line)
    return b"\n".join(out) + b"\n" if out else b""
