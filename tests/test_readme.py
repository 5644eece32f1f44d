"""The README's configuration table is the one the code generates."""

from neuron_exporter.config import options_table
from tests.support.paths import ROOT


def test_readme_options_table_matches_the_code():
    readme = (ROOT / "README.md").read_text()
    start = readme.index("<!-- options table")
    table = readme[readme.index("\n", start) + 1 : readme.index("<!-- end of options table -->")]
    assert table.strip() == options_table().strip()
