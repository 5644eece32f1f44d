"""The NeuronCores a process uses, as the Neuron runtime and neuron-monitor number them.

``NEURON_RT_VISIBLE_CORES`` names them: a core (``3``), an inclusive range (``0-3``) or a comma-separated list of
both (``0,2,4-7``). The indices are the runtime's NeuronCores, logical ones where ``NEURON_LOGICAL_NC_CONFIG``
groups physical cores (``2``, Trainium2's default: index 1 is physical cores 2 and 3); neuron-monitor and neuron-ls
number a process's cores the same way, so the indices join as they are, and the configuration is carried beside
them (``logical_nc_config``) for whoever maps them to physical cores.

Unset, the runtime takes every core (or ``NEURON_RT_NUM_CORES`` of them, its choice): no cores, nothing guessed.
A value that is not such a list gets one warning naming it, and no cores.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping

from ..untrusted import quoted

log = logging.getLogger("neuron_exporter")

VISIBLE_CORES_ENV = "NEURON_RT_VISIBLE_CORES"
LOGICAL_CONFIG_ENV = "NEURON_LOGICAL_NC_CONFIG"
LOGICAL_CONFIGS = ("1", "2")
# More than any instance has (a trn2.48xlarge: 128 physical cores): a bound on the series, not a hardware fact.
MAX_CORES = 512
ITEM = re.compile(r"([0-9]{1,4})(?:-([0-9]{1,4}))?")

_warned: set[tuple[str, str]] = set()  # (variable, value): each bad value is told once per process


def parse_cores(text: str) -> tuple[int, ...]:
    """The core indices of a ``NEURON_RT_VISIBLE_CORES`` value, sorted; ``ValueError`` says what is wrong."""
    cores: set[int] = set()
    for item in text.split(","):
        match = ITEM.fullmatch(item.strip())
        if match is None:
            raise ValueError(f"{quoted(item.strip())} is neither a core index nor a range")
        first = int(match.group(1))
        last = int(match.group(2)) if match.group(2) is not None else first
        if last < first:
            raise ValueError(f"the range {first}-{last} ends before it starts")
        if last - first >= MAX_CORES:
            raise ValueError(f"the range {first}-{last} has more than {MAX_CORES} cores")
        cores.update(range(first, last + 1))
    if len(cores) > MAX_CORES:
        raise ValueError(f"more than {MAX_CORES} cores")
    return tuple(sorted(cores))


def _warn_once(variable: str, value: str, problem: str) -> None:
    if (variable, value) not in _warned:
        _warned.add((variable, value))
        log.warning("neuron-exporter: %s=%s is not used: %s", variable, quoted(value), problem)


_cores: dict[str, tuple[int, ...]] = {}  # a value of the variable -> its cores: a scrape reads it again


def visible_cores(env: Mapping[str, str]) -> tuple[int, ...]:
    """The cores ``NEURON_RT_VISIBLE_CORES`` names in ``env``; none when it is unset or not a list of cores."""
    text = env.get(VISIBLE_CORES_ENV)
    if not text:
        return ()
    cores = _cores.get(text)
    if cores is None:
        try:
            cores = parse_cores(text)
        except ValueError as error:
            _warn_once(VISIBLE_CORES_ENV, text, f"{error} (expected a core, a range such as 0-3, or a list: 0,2,4-7)")
            cores = ()
        if len(_cores) < 16:  # a process has one value, or a few if the launcher sets it late
            _cores[text] = cores
    return cores


def logical_config(env: Mapping[str, str]) -> str:
    """``NEURON_LOGICAL_NC_CONFIG`` as a label value: ``1``, ``2``, or empty when unset (the instance's default)
    or not one of those."""
    text = env.get(LOGICAL_CONFIG_ENV, "").strip()
    if text in LOGICAL_CONFIGS or not text:
        return text
    _warn_once(LOGICAL_CONFIG_ENV, text, f"expected one of {', '.join(LOGICAL_CONFIGS)}")
    return ""
