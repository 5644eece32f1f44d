"""The READMEs agree with the code: the configuration table is the one the code generates, and the files they
link to and the modules they run are where they say."""

import re

import pytest

from neuron_exporter.config import options_table
from tests.support.paths import DASHBOARDS, ROOT

READMES = [
    ROOT / "README.md",
    DASHBOARDS / "README.md",
    ROOT / "deploy" / "README.md",
    ROOT / "deploy" / "prometheus" / "runbook.md",
]


def test_readme_options_table_matches_the_code():
    readme = (ROOT / "README.md").read_text()
    start = readme.index("<!-- options table")
    table = readme[readme.index("\n", start) + 1 : readme.index("<!-- end of options table -->")]
    assert table.strip() == options_table().strip()


def runnable(module: str) -> bool:
    """Whether ``python -m module`` runs a file of the checkout: a module, or a package's ``__main__``."""
    path = ROOT / module.replace(".", "/")
    return path.with_suffix(".py").is_file() or (path / "__main__.py").is_file()


@pytest.mark.parametrize("readme", READMES, ids=lambda path: path.relative_to(ROOT).as_posix())
def test_links_and_modules_of_the_readmes_exist(readme):
    text = readme.read_text()
    links = [link for link in re.findall(r"\]\(([^)#\s]+)", text) if "://" not in link]
    assert [link for link in links if not (readme.parent / link).exists()] == []
    modules = set(re.findall(r"python3? -m ([a-z_][a-z0-9_.]*)", text))
    assert [m for m in modules if not runnable(m)] == []
