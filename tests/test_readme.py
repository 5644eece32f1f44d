"""The README's configuration table is the one the code generates."""

from conftest import ROOT

from neuron_exporter.config import options_table


def test_readme_options_table_matches_the_code():
    readme = (ROOT / "README.md").read_text()
    start = readme.index("<!-- options table")
    table = readme[readme.index("\n", start) + 1 : readme.index("<!-- end of options table -->")]
    assert table.strip() == options_table().strip()
