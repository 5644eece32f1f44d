"""The diagnosis: the detail that labels cannot carry, per rank and site, as JSON and as a ranked list of what to fix.

Three parts, each a module: the document (``document``: its format, the checks of a document read from elsewhere,
the bounds a writer keeps, the merge of several ranks), the advice engine (``advice``: every problem, ranked by
what it costs, with what to do), and the rendering (``render``: the ranked list as text, and the ``/diagnosis``
page of an endpoint). Used by the training process (to serve its own), the node endpoint and ``neuron-exporter
diagnose``, rooms that may not import each other: the package imports nothing else of the package, and every room
may import it. Its names are here for them.
"""

from .document import (
    FORMAT,
    MAX_BYTES,
    MAX_FRAMES,
    MAX_PAGE_BYTES,
    MAX_TEXT,
    DiagnosisError,
    dumps,
    fit,
    loads,
    merge,
    rank_order,
)
from .render import page, render_text

__all__ = [
    "FORMAT",
    "MAX_BYTES",
    "MAX_FRAMES",
    "MAX_PAGE_BYTES",
    "MAX_TEXT",
    "DiagnosisError",
    "dumps",
    "fit",
    "loads",
    "merge",
    "page",
    "rank_order",
    "render_text",
]
