"""Reading a configuration file, strictly, and showing what it held in one-line errors.

Every configuration the package reads goes through here: the exporter's options (``config``), the web config
(``web/web_config``) and the mixin configuration of the dashboards and rules (``mixin/config``). A file is
a regular file (a FIFO would block the reader) of at most 1 MiB of UTF-8 text, holding one YAML document nested at
most ``MAX_NESTING`` levels, without a key twice in a mapping. Anything else is a ``ConfigError``, whose message
is one printable line: ``file:line: option: what is wrong`` (``untrusted.quoted`` shows what the file held).
``dump_yaml`` writes the YAML files the package generates.
"""

from __future__ import annotations

import os
import stat
from typing import Any

import yaml

from .untrusted import SHOWN_CHARACTERS, printable, quoted

MAX_BYTES = 1024 * 1024  # a config is a dozen lines; a larger file is the wrong file
MAX_NESTING = 50  # levels of mappings and sequences; the formats need 3; PyYAML's composer recurses once per level


class ConfigError(ValueError):
    """A configuration mistake; ``str()`` is one line saying where (file and line, or the option as the user
    named it: a variable, a flag) and what is wrong."""

    def __init__(self, problem: str, file=None, line: int | None = None, option: str | None = None):
        self.problem, self.file, self.line, self.option = problem, file, line, option
        where = None if file is None else printable(os.fsdecode(file)) + ("" if line is None else f":{line}")
        message = ": ".join(part for part in (where, option, problem) if part)
        # Callers quote what the file held; a piece that was not is escaped here, so the message stays one line.
        super().__init__(message if message.isprintable() else printable(message))


def line_of(node) -> int:
    """The line of a YAML node or event, counted from 1."""
    return node.start_mark.line + 1


def read_text(path, what: str) -> str:
    """The text of ``path``: a regular file of at most ``MAX_BYTES``, in UTF-8. ``what`` names the file in errors
    ("config file": "cannot read config file", "too large for a config file")."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # opening a FIFO must not wait for a writer
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        raise ConfigError(f"cannot read {what}: {getattr(exc, 'strerror', None) or exc}", path) from None
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise ConfigError(f"cannot read {what}: it is a directory", path)
        if not stat.S_ISREG(mode):
            raise ConfigError(f"cannot read {what}: not a regular file (a FIFO, device or socket)", path)
        with os.fdopen(fd, "rb", closefd=False) as file:
            data = file.read(MAX_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read {what}: {exc.strerror or exc}", path) from None
    finally:
        os.close(fd)
    if len(data) > MAX_BYTES:
        raise ConfigError(f"larger than 1 MiB, too large for a {what}", path)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ConfigError(f"not UTF-8 text (byte {exc.start}); a {what} is UTF-8", path, line) from None


class _StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key twice in a mapping and nesting deeper than ``MAX_NESTING``."""

    def __init__(self, text: str, path):
        super().__init__(text)  # refuses control characters here, before reading anything
        self.path = path
        self.depth = 0

    def compose_node(self, parent, index):
        if not self.check_event(yaml.MappingStartEvent, yaml.SequenceStartEvent):
            return super().compose_node(parent, index)
        if self.depth == MAX_NESTING:
            line = line_of(self.peek_event())
            raise ConfigError(f"nested deeper than {MAX_NESTING} levels", self.path, line)
        self.depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def compose_mapping_node(self, anchor):
        node = super().compose_mapping_node(anchor)
        first: dict[tuple[str, str], int] = {}
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode):
                key = (key_node.tag, key_node.value)
                if key in first:
                    raise ConfigError(
                        f"duplicate key {quoted(key_node.value)} (first on line {first[key]})",
                        self.path,
                        line_of(key_node),
                    )
                first[key] = line_of(key_node)
        return node


class YamlFile:
    """The one YAML document of a config file, as nodes (``root``, None for an empty file), so that an error can
    name the line of each key and value; ``value`` builds a node's Python value."""

    def __init__(self, path, what: str):
        self.path = path
        self.what = what
        text = read_text(path, what)
        try:
            loader = _StrictLoader(text, path)
        except yaml.reader.ReaderError as exc:
            line = text.count("\n", 0, exc.position) + 1
            character = chr(exc.character) if isinstance(exc.character, int) else str(exc.character)
            raise ConfigError(f"invalid YAML: the character {quoted(character)} is not allowed", path, line) from None
        self._loader = loader
        try:
            self.root: yaml.Node | None = loader.get_single_node()
        except yaml.YAMLError as exc:
            raise self._invalid(exc) from None
        finally:
            loader.dispose()

    def error(self, problem: str, node: yaml.Node | None = None, option: str | None = None) -> ConfigError:
        return ConfigError(problem, self.path, None if node is None else line_of(node), option)

    def mapping(self, node: yaml.Node | None, expected: str) -> dict[str, tuple[yaml.Node, yaml.Node]]:
        """The entries of a mapping node (none for an empty file or a null value) by their keys, which must be plain
        strings; ``expected`` is the error for any other node, such as "the config file must be a mapping"."""
        if node is None or (isinstance(node, yaml.ScalarNode) and node.tag.endswith(":null")):
            return {}
        if not isinstance(node, yaml.MappingNode):
            raise self.error(expected, node)
        entries: dict[str, tuple[yaml.Node, yaml.Node]] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise self.error("a key must be a plain string, not a list or a mapping", key_node)
            entries[key_node.value] = (key_node, value_node)
        return entries

    def value(self, node: yaml.Node, option: str | None = None) -> Any:
        """The Python value of ``node``, as PyYAML's safe loader builds it; ``option`` names it in errors."""
        try:
            return self._loader.construct_object(node, deep=True)
        except yaml.YAMLError as exc:  # such as a tag no safe constructor knows
            raise self._invalid(exc) from None
        except (ValueError, OverflowError) as exc:  # a tagged value such as !!int 1x, or an integer of 5000 digits
            problem = printable(str(exc), SHOWN_CHARACTERS * 2)
            raise self.error(f"cannot read the value: {problem}", node, option) from None

    def _invalid(self, exc: yaml.YAMLError) -> ConfigError:
        mark = getattr(exc, "problem_mark", None)
        problem = printable(str(getattr(exc, "problem", None) or exc), SHOWN_CHARACTERS * 2)
        return ConfigError(f"invalid YAML: {problem}", self.path, None if mark is None else mark.line + 1)


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (rule expressions, dashboard JSON) as literal blocks; everything else as PyYAML writes it."""


_Dumper.add_representer(
    str,
    lambda dumper, data: dumper.represent_scalar("tag:yaml.org,2002:str", data, style="|" if "\n" in data else None),
)


def dump_yaml(content: Any) -> str:
    """``content`` as YAML, keys in their order, for the files the package generates (rules, Kubernetes objects)."""
    return yaml.dump(content, Dumper=_Dumper, sort_keys=False, width=120, allow_unicode=True)
