"""README.md is the front door: short, and it links every page of docs/. CONTRIBUTING.md's layout is the tree's.

The layout is read from the tree, not from a list here: a folder added, moved or removed in neuron_exporter/,
tests/ or at the repository's root changes what this test expects, and only CONTRIBUTING.md's list (between its
``<!-- layout`` and ``<!-- end of layout -->`` lines) needs the same change.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.support.paths import ROOT

README_MAX_LINES = 250
# Never part of the layout: what tools and builds leave in a checkout.
NOT_ROOMS = {"__pycache__", "build", "dist"}


def is_room(path: Path) -> bool:
    return (
        path.is_dir()
        and path.name not in NOT_ROOMS
        and not path.name.startswith(".")
        and not path.name.endswith(".egg-info")
        and any(child.is_file() for child in path.rglob("*") if "__pycache__" not in child.parts)
    )


def rooms(root: Path = ROOT) -> set[str]:
    """Every folder at the repository's root, every folder of the package at any depth, every room of tests/."""
    found = {path for path in root.iterdir() if is_room(path)}
    found |= {path for path in (root / "neuron_exporter").rglob("*") if is_room(path)}
    found |= {path for path in (root / "tests").iterdir() if is_room(path)}
    return {path.relative_to(root).as_posix() + "/" for path in found}


def listed_rooms(contributing: str) -> list[str]:
    """The folders CONTRIBUTING.md's layout lists: each bullet that starts with a folder in backquotes."""
    start = contributing.index("<!-- layout")
    layout = contributing[start : contributing.index("<!-- end of layout -->", start)]
    return re.findall(r"^\s*- `([^`]+/)`", layout, flags=re.MULTILINE)


def test_contributing_lists_every_room_of_the_tree_and_only_those():
    listed = listed_rooms((ROOT / "CONTRIBUTING.md").read_text())
    assert sorted(rooms() - set(listed)) == [], "missing from CONTRIBUTING.md's layout"
    assert [room for room in listed if not (ROOT / room).is_dir()] == [], "listed, but not in the tree"
    assert len(listed) == len(set(listed))


def test_a_room_missing_from_the_layout_is_caught(tmp_path):
    for folder in ("neuron_exporter/node", "neuron_exporter/newroom/deeper", "tests/web", "docs"):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "x.py").write_text("")
    (tmp_path / "neuron_exporter" / "__pycache__").mkdir()
    (tmp_path / ".venv").mkdir()
    (tmp_path / ".venv" / "x").write_text("")
    listed = listed_rooms("<!-- layout -->\n- `neuron_exporter/node/`: x\n  - `tests/web/`: y\n<!-- end of layout -->")
    assert sorted(rooms(tmp_path) - set(listed)) == [
        "docs/",
        "neuron_exporter/",
        "neuron_exporter/newroom/",
        "neuron_exporter/newroom/deeper/",
        "tests/",
    ]


def test_readme_is_the_front_door():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= README_MAX_LINES
    linked = set(re.findall(r"\]\((docs/[^)#\s]+\.md)", readme)) | set(re.findall(r"\]\((CONTRIBUTING\.md)", readme))
    pages = {path.relative_to(ROOT).as_posix() for path in (ROOT / "docs").glob("*.md")} | {"CONTRIBUTING.md"}
    assert sorted(pages - linked) == []


def constant(path: Path, name: str):
    """A module-level constant of a script, read without running it (examples/train.py imports torch)."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise LookupError(f"{path.name} has no {name}")


def test_readme_shows_what_the_demo_prints():
    readme = (ROOT / "README.md").read_text()
    phases = constant(ROOT / "examples" / "train.py", "PHASES")
    shown = re.findall(r"^phase (\w+) +steps +(\d+) ", readme, flags=re.MULTILINE)
    assert shown == [(name, str(steps)) for name, steps in phases]
    assert constant(ROOT / "examples" / "demo.py", "PHASES") == len(phases)
    alerts = readme[readme.index("demo: alerts that fired in Prometheus:") :]
    for alert in constant(ROOT / "examples" / "demo.py", "EXPECTED_ALERTS"):
        assert f"\n  {alert} {{" in alerts
