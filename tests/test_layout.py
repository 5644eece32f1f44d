"""The package's folders keep to their import rules: each folder is a place the code runs.
The tests keep to theirs: a folder per room, helpers shared through tests/support only.

training/ (inside the training process) never imports reports/; node/ (the daemon) never imports training/ or reports/;
web/ and reports/ import no other folder; the shared top-level modules and the shared diagnosis/ import no other folder
at all, and every folder may import them. cli/, the ``neuron-exporter`` command, puts the folders together (with the
public face, ``__init__`` and ``__main__``); no folder imports it. In web/, the connection layer (``connections``,
``connection``, ``admission``, ``http_messages``, ``lanes``) knows no route, metric or user: of the package it uses
the rate limits only. mixin/, the generator of the dashboards and rules (it needs the Grafana SDK, an extra), imports
no other folder, and only ``cli/assets_command`` (``neuron-exporter assets --config``) imports it. The commands that
start training processes (``cli/run_command``) read where the training package's start-up files are
(``neuron_exporter.training.AUTOSTART_DIR``: the package's ``__init__``, which imports nothing, so reading it loads
nothing of training); node/ does not even read that.

In training/, each source is a room of its own (``xla/``, ``torch_compile/``, ``steps/``, ``neuron/``...: every
sub-package) and never imports a sibling; what two sources share lives in training/ itself.

No module imports itself back: the imports between the package's modules form no cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support.paths import ROOT

PACKAGE = ROOT / "neuron_exporter"
ROOMS = {"training", "node", "reports", "web", "mixin", "cli"}
SHARED_FOLDERS = {"diagnosis"}  # shared like the top-level modules
FOLDERS = ROOMS | SHARED_FOLDERS
FORBIDDEN = {
    "training": {"reports", "mixin", "cli"},
    "node": {"training", "reports", "mixin", "cli"},
    "reports": {"training", "node", "web", "mixin", "cli"},
    "web": {"training", "node", "reports", "mixin", "cli"},
    "mixin": {"training", "node", "reports", "web", "cli"},
    "cli": set(),
    "": ROOMS,  # config, snapshot, diagnosis/, ...: shared by all, so they depend on none
}
PUBLIC_FACE = {"__init__.py", "__main__.py"}
# The one way into the mixin from the rest of the package: `neuron-exporter assets --config`.
ALLOWED = {"cli/assets_command.py": {"mixin"}}


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
    """The room of a dotted name of the package ("" for what all share), None outside the package."""
    parts = module.split(".")
    if parts[0] != "neuron_exporter":
        return None
    return parts[1] if len(parts) > 1 and parts[1] in ROOMS else ""


def violations(package: Path = PACKAGE) -> list[str]:
    found = []
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package)
        folder = relative.parts[0] if len(relative.parts) > 1 and relative.parts[0] in ROOMS else ""
        if relative.as_posix() in PUBLIC_FACE:
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
        ("web", "from ..node import spool_format"),
        ("reports", "from ..web.http_server import MetricsServer"),
        ("web", "from ..mixin import build"),
        ("training", "import neuron_exporter.mixin.rules"),
        ("mixin", "from ..training.rank import rank_labels"),
        ("node", "from ..cli import main"),
        ("node", "from ..training import autostart"),
        ("node", "from ..training import AUTOSTART_DIR"),
        ("web", "from ..training import AUTOSTART_DIR"),
        ("diagnosis", "from ..web.http_server import MetricsServer"),
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


def module_name(path: Path, root: Path = PACKAGE) -> str:
    parts = ["neuron_exporter", *path.relative_to(root).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_nodes(tree: ast.Module, lazy_too: bool):
    """The import statements of a module: everywhere in it (an import in a function is a dependency as much as
    one at the top), or, without ``lazy_too``, only those that run when it is imported."""
    if lazy_too:
        yield from (node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom)))
        return
    pending: list[ast.AST] = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            pending.extend(ast.iter_child_nodes(node))


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Module -> the modules of the package it imports. The package's public face (``neuron_exporter/__init__``)
    counts only what it imports when imported: it loads ``attach`` on first use of ``neuron_exporter.attach``, the
    entry point of the modules that read its constants. A package's ``__init__`` run on the way to a submodule is
    not an edge: Python has it loaded first, whatever it imports."""
    modules = {module_name(path, package): path for path in package.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        prefix = ["neuron_exporter", *path.relative_to(package).parent.parts]
        edges = set()
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in _import_nodes(tree, lazy_too=name != "neuron_exporter"):
            if isinstance(node, ast.Import):
                edges.update(alias.name for alias in node.names)
            else:
                base = prefix[: len(prefix) - node.level + 1] if node.level else []
                module = ".".join(base + ([node.module] if node.module else []))
                edges.add(module)
                edges.update(f"{module}.{alias.name}" for alias in node.names)  # from . import a submodule
        graph[name] = {edge for edge in edges if edge in modules and edge != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def test_no_module_imports_itself_back():
    assert cycles(import_graph()) == []


@pytest.mark.parametrize(
    "module, line, cycle",
    [
        ("config_file.py", "from . import config", ["neuron_exporter.config", "neuron_exporter.config_file"]),
        (
            "untrusted.py",
            "from .config import Options",
            ["neuron_exporter.config", "neuron_exporter.config_file", "neuron_exporter.untrusted"],
        ),
        (
            "diagnosis/document.py",
            "from .render import page",
            [
                "neuron_exporter.diagnosis.advice",
                "neuron_exporter.diagnosis.document",
                "neuron_exporter.diagnosis.render",
            ],
        ),
    ],
)
def test_an_import_cycle_is_caught(tmp_path, module, line, cycle):
    copy = copy_of_the_package(tmp_path)
    assert cycles(import_graph(copy)) == []
    path = copy / module
    path.write_text(path.read_text() + f"\n{line}\n")
    assert cycles(import_graph(copy)) == [cycle]


def test_an_import_inside_a_function_closes_a_cycle_too(tmp_path):
    """As assets_command and the dashboards generator did: one imported the other in a function."""
    copy = copy_of_the_package(tmp_path)
    path = copy / "config_file.py"
    path.write_text(path.read_text() + "\n\ndef later():\n    from . import config\n")
    assert cycles(import_graph(copy)) == [["neuron_exporter.config", "neuron_exporter.config_file"]]


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


# The connection layer: its modules may use the rate limits and one another, nothing else of the package.
CONNECTION_LAYER = ("connections", "connection", "admission", "http_messages", "lanes")
CONNECTIONS_MAY_USE = ("neuron_exporter.web.rate_limit", *(f"neuron_exporter.web.{name}" for name in CONNECTION_LAYER))


def connection_layer_violations(package: Path = PACKAGE) -> list[str]:
    return [
        f"web/{name}.py imports {module}"
        for name in CONNECTION_LAYER
        for module in sorted(imported_modules(package / "web" / f"{name}.py", package))
        if module.split(".")[0] in ("neuron_exporter", "prometheus_client")
        and not any((module + ".").startswith(allowed + ".") for allowed in CONNECTIONS_MAY_USE)
    ]


def test_the_connection_layer_knows_no_route_metric_or_user():
    assert connection_layer_violations() == []


@pytest.mark.parametrize("name", CONNECTION_LAYER)
@pytest.mark.parametrize(
    "line",
    [
        "from .http_server import MetricsServer",
        "from .basic_auth import BasicAuth",
        "from .. import __version__",
        "from prometheus_client.exposition import choose_encoder",
    ],
)
def test_an_application_import_in_the_connection_layer_is_caught(tmp_path, name, line):
    copy = tmp_path / "neuron_exporter" / "web"
    copy.mkdir(parents=True)
    for module in CONNECTION_LAYER:
        (copy / f"{module}.py").write_text((PACKAGE / "web" / f"{module}.py").read_text())
    (copy / f"{name}.py").write_text((PACKAGE / "web" / f"{name}.py").read_text() + f"\n{line}\n")
    found = connection_layer_violations(tmp_path / "neuron_exporter")
    assert found and all(violation.startswith(f"web/{name}.py imports ") for violation in found)


def test_only_assets_command_imports_the_mixin(tmp_path):
    copy = copy_of_the_package(tmp_path)
    assert "from ..mixin import build" in (copy / "cli" / "assets_command.py").read_text()
    config = copy / "config.py"
    config.write_text(config.read_text() + "\nfrom .mixin import build\n")
    assert violations(copy) == [
        "config.py imports neuron_exporter.mixin",
        "config.py imports neuron_exporter.mixin.build",
    ]


def test_the_training_package_face_imports_nothing():
    """`neuron-exporter run` reads AUTOSTART_DIR from training/__init__: that must load nothing of training."""
    face = PACKAGE / "training" / "__init__.py"
    assert {name.split(".")[0] for name in imported_modules(face)} <= {"os"}


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
