"""The package's folders keep to their import rules: each folder is a place the code runs.
The tests keep to theirs: a folder per room, helpers shared through tests/support only.

training/ (inside the training process) never imports reports/; node/ (the daemon) never imports training/ or
reports/; web/ and reports/ import no other folder; the shared top-level modules import no folder at all (only the
public face, ``__init__``, ``__main__`` and ``cli``, puts the folders together). In web/, the connection layer
(``connections``) knows no route, metric or user: of the package it uses the rate limits only. dashboards/, the
generator of the dashboards and rules (it needs the Grafana SDK, an extra), imports no other folder, and only
``assets_command`` (``neuron-exporter assets --config``) imports it. In training/, each source is a room of its own
(``xla/``, ``torch_compile/``, ``steps/``, ``neuron/``...: every sub-package) and never imports a sibling; what two
sources share lives in training/ itself.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support.paths import ROOT

PACKAGE = ROOT / "neuron_exporter"
FOLDERS = {"training", "node", "reports", "web", "dashboards"}
FORBIDDEN = {
    "training": {"reports", "dashboards"},
    "node": {"training", "reports", "dashboards"},
    "reports": {"training", "node", "web", "dashboards"},
    "web": {"training", "node", "reports", "dashboards"},
    "dashboards": {"training", "node", "reports", "web"},
    "": FOLDERS,  # config, snapshot, ...: shared by all, so they depend on none
}
PUBLIC_FACE = {"__init__.py", "__main__.py", "cli.py"}
# The one way into the dashboards generator from the rest of the package: `neuron-exporter assets --config`.
ALLOWED = {"assets_command.py": {"dashboards"}}


def imported_modules(path: Path, root: Path = PACKAGE) -> set[str]:
    """Absolute dotted names of every module ``path`` (under ``root``) imports, relative imports resolved."""
    package = ["neuron_exporter", *path.relative_to(root).parent.parts]
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)  # from . import explain
    return names


def folder_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "neuron_exporter":
        return None
    return parts[1] if len(parts) > 1 and parts[1] in FOLDERS else ""


def violations(package: Path = PACKAGE) -> list[str]:
    found = []
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package)
        folder = relative.parts[0] if len(relative.parts) > 1 else ""
        if folder == "" and relative.name in PUBLIC_FACE:
            continue
        for module in sorted(imported_modules(path, package)):
            target = folder_of(module)
            if target and target in FORBIDDEN[folder] - ALLOWED.get(relative.as_posix(), set()):
                found.append(f"{relative} imports {module}")
    return found


def test_every_module_lives_in_a_known_place():
    for path in PACKAGE.rglob("*.py"):
        relative = path.relative_to(PACKAGE)
        assert len(relative.parts) == 1 or relative.parts[0] in FOLDERS, relative


def test_the_package_keeps_its_import_rules():
    assert violations() == []


@pytest.mark.parametrize(
    "folder, line",
    [
        ("training", "from ..reports import explain"),
        ("training", "from ..reports.explain import explain"),
        ("node", "from ..training.rank import rank_labels"),
        ("node", "import neuron_exporter.training.attach"),
        ("web", "from ..node import spool"),
        ("reports", "from ..web.http_server import MetricsServer"),
        ("web", "from ..dashboards import build"),
        ("training", "import neuron_exporter.dashboards.rules"),
        ("dashboards", "from ..training.rank import rank_labels"),
    ],
)
def test_a_forbidden_import_is_caught(tmp_path, folder, line):
    copy = copy_of_the_package(tmp_path)
    module = sorted((copy / folder).glob("[!_]*.py"))[0]
    module.write_text(module.read_text() + f"\n{line}\n")
    forbidden_folder = line.replace("..", "neuron_exporter.").split()[1].split(".")[1]
    found = violations(copy)
    assert found, line
    assert all(v.startswith(f"{module.relative_to(copy)} imports neuron_exporter.{forbidden_folder}") for v in found)


TRAINING = "neuron_exporter.training"


def source_room_of(module: str) -> str | None:
    """The source room (a sub-package of training/) a module belongs to, None if none."""
    parts = module.split(".")
    if module.startswith(TRAINING + ".") and len(parts) > 3:
        return parts[2]
    return None


def source_room_violations(package: Path = PACKAGE) -> list[str]:
    found = []
    for path in sorted((package / "training").glob("*/*.py")):
        room = path.parent.name
        for module in sorted(imported_modules(path, package)):
            target = source_room_of(module)
            if target is not None and target != room and (package / "training" / target / "__init__.py").exists():
                found.append(f"{path.relative_to(package)} imports {module}")
    return found


def test_the_source_rooms_exist_and_keep_apart():
    rooms = {path.parent.name for path in (PACKAGE / "training").glob("*/__init__.py")}
    assert {"xla", "torch_compile", "steps"} <= rooms
    assert source_room_violations() == []


@pytest.mark.parametrize(
    "room, line",
    [
        ("xla", "from ..torch_compile.reasons import guard_reason"),
        ("steps", "from ..xla.step_tracker import StepState"),
        ("torch_compile", "import neuron_exporter.training.steps.training_steps"),
        ("neuron", "from ..xla import source"),
    ],
)
def test_a_source_importing_a_sibling_is_caught(tmp_path, room, line):
    copy = copy_of_the_package(tmp_path)
    folder = copy / "training" / room
    if not folder.exists():  # a room yet to come
        folder.mkdir()
        (folder / "__init__.py").write_text('"""A source."""\n')
    module = sorted(folder.glob("*.py"))[-1]
    module.write_text(module.read_text() + f"\n{line}\n")
    found = source_room_violations(copy)
    assert found and all(v.startswith(f"{module.relative_to(copy)} imports neuron_exporter.training.") for v in found)
    assert all(source_room_of(v.split()[-1]) not in (room, None) for v in found)


CONNECTIONS_MAY_USE = "neuron_exporter.web.rate_limit"


def connection_layer_violations(package: Path = PACKAGE) -> list[str]:
    path = package / "web" / "connections.py"
    return [
        f"web/connections.py imports {module}"
        for module in sorted(imported_modules(path, package))
        if module.split(".")[0] in ("neuron_exporter", "prometheus_client")
        and not (module + ".").startswith(CONNECTIONS_MAY_USE + ".")
    ]


def test_the_connection_layer_knows_no_route_metric_or_user():
    assert connection_layer_violations() == []


@pytest.mark.parametrize(
    "line",
    [
        "from .http_server import MetricsServer",
        "from .basic_auth import BasicAuth",
        "from .. import __version__",
        "from prometheus_client.exposition import choose_encoder",
    ],
)
def test_an_application_import_in_the_connection_layer_is_caught(tmp_path, line):
    copy = tmp_path / "neuron_exporter" / "web" / "connections.py"
    copy.parent.mkdir(parents=True)
    copy.write_text((PACKAGE / "web" / "connections.py").read_text() + f"\n{line}\n")
    assert connection_layer_violations(tmp_path / "neuron_exporter")


def test_only_assets_command_imports_the_dashboards_generator(tmp_path):
    copy = copy_of_the_package(tmp_path)
    assert "from .dashboards import build" in (copy / "assets_command.py").read_text()
    config = copy / "config.py"
    config.write_text(config.read_text() + "\nfrom .dashboards import build\n")
    assert violations(copy) == [
        "config.py imports neuron_exporter.dashboards",
        "config.py imports neuron_exporter.dashboards.build",
    ]


def copy_of_the_package(tmp_path: Path) -> Path:
    copy = tmp_path / "neuron_exporter"
    for path in PACKAGE.rglob("*.py"):
        target = copy / path.relative_to(PACKAGE)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(path.read_text())
    return copy


TESTS = ROOT / "tests"
TEST_ROOMS = {"training", "node", "web", "reports", "config", "assets", "end_to_end"}


def test_tests_live_in_rooms_and_share_helpers_only_through_tests_support():
    for path in sorted(TESTS.rglob("test_*.py")):
        relative = path.relative_to(TESTS)
        if relative.parent != Path("."):
            assert relative.parts[0] in TEST_ROOMS, f"{relative}: not in a room ({sorted(TEST_ROOMS)})"
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ImportFrom) and node.module:
                imported = node.module.split(".")[-1]
                assert not imported.startswith("test_") and imported != "conftest", (
                    f"{relative} imports {node.module}: shared helpers belong in tests/support"
                )
