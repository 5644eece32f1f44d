"""A rank's exposition as the node endpoint checks it before serving it (node/exposition_check.py)."""

from __future__ import annotations

import pytest

from neuron_exporter.node.exposition_check import ExpositionError, check_exposition, recheck


def test_a_rewrite_is_checked_in_full_unless_only_values_changed():
    good = (
        b"# HELP xla_steps_total Steps\n# TYPE xla_steps_total counter\n"
        b'xla_steps_total{local_rank="0",rank="0",run_id="r"} 1.0\n'
    )
    first = recheck(good, None, "0", "0", "r")
    assert recheck(good.replace(b" 1.0\n", b" 2.0\n"), first, "0", "0", "r").text.endswith(b" 2.0\n")
    for bad in (
        good.replace(b" 1.0\n", b" two\n"),  # a value that is no number
        good.replace(b'rank="0"', b'rank="1"'),  # another rank's series, same shape
        good.replace(b" 1.0\n", b" 1.0 1000\n"),  # a timestamp
        good.replace(b"HELP xla_steps_total Steps", b"HELP xla_steps_total Steps\\q"),
    ):  # a bad escape
        with pytest.raises(ExpositionError):
            recheck(bad, first, "0", "0", "r")


def test_an_offending_line_is_quoted_on_one_line_and_cut_short():
    bad = (
        b"# HELP xla_steps_total Steps\n# TYPE xla_steps_total counter\nxla_steps_total\x1b[2J\r{" + b"x" * 200 + b"\n"
    )
    with pytest.raises(ExpositionError) as raised:
        check_exposition(bad, "0", "0", "r")
    message = str(raised.value)
    assert message.isprintable() and "\\x1b[2J\\r" in message and message.endswith("...")


@pytest.mark.parametrize(
    "labels",
    [
        b'rank="0",rank="0",local_rank="0",run_id="r"',  # Prometheus: "label name rank is not unique"
        b'__name__="up",local_rank="0",rank="0",run_id="r"',  # a reserved name, which it refuses as well
    ],
    ids=["repeated", "reserved"],
)
def test_a_sample_prometheus_would_refuse_is_one_rejected_file(labels):
    # Prometheus drops the whole scrape for one such sample: every rank of the node would go with it.
    bad = b"# HELP xla_steps_total Steps\n# TYPE xla_steps_total counter\nxla_steps_total{" + labels + b"} 7.0\n"
    with pytest.raises(ExpositionError, match="repeated or reserved"):
        check_exposition(bad, "0", "0", "r")
