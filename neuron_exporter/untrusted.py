"""What every part of the package does with input it cannot trust or bound: escape it for a one-line message
(``printable``, ``quoted``), keep the label values it makes bounded (``LabelBudget``), and exit with
``EXIT_USAGE`` when a command was given something wrong."""

from __future__ import annotations

from . import fork_safe

EXIT_USAGE = 2  # of every command, for a mistake of the user's (as argparse exits for a bad argument)
SHOWN_CHARACTERS = 80  # of a value quoted in an error
OTHER = "other"  # the label value of what a budget has no room for


def printable(text: str, limit: int | None = None) -> str:
    """``text`` with every non-printable character (newline, terminal escape, ...) and backslash escaped, cut to
    ``limit`` characters with ``...``."""
    shown = ""
    for character in text:
        piece = character if character.isprintable() and character != "\\" else repr(character)[1:-1]
        if limit is not None and len(shown) + len(piece) > limit:
            return shown + "..."
        shown += piece
    return shown


def quoted(text: str, limit: int = SHOWN_CHARACTERS) -> str:
    """``text`` in double quotes for an error message: escaped (its double quotes too), cut short."""
    return '"' + printable(text, limit).replace('"', '\\"') + '"'


class LabelBudget:
    """Admits at most ``limit`` distinct label values; later ones are reported as ``other``.

    Admission is first come, first served and remembered, so a series never moves into ``other`` once it
    has been exported (which would make its counter go backwards).
    """

    def __init__(self, limit: int):
        self.limit = limit
        self._admitted: set[str] = set()
        self._lock = fork_safe.Lock()  # concurrent scrapes must not admit more than the limit between them

    def label_for(self, value: str) -> str:
        if value in self._admitted:
            return value
        with self._lock:
            if value in self._admitted or len(self._admitted) < self.limit:
                self._admitted.add(value)
                return value
        return OTHER
