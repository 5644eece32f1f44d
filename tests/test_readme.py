"""The documentation agrees with the code: the configuration table is the one the code generates; the files and
headings it links to, the modules it runs, the make targets it names, the metrics and the alerts it lists exist."""

import argparse
import re
import shlex
from pathlib import Path

import pytest

from neuron_exporter.catalogue import FAMILIES
from neuron_exporter.config import NOT_OPTIONS, options_table
from tests.support.contract import CONTRACT_METRICS
from tests.support.paths import DASHBOARDS, ROOT

# The user documentation (README.md is its front door), and the READMEs of the shipped files.
DOCS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
READMES = [
    *DOCS,
    DASHBOARDS / "README.md",
    ROOT / "deploy" / "README.md",
    ROOT / "deploy" / "PROTOCOL.md",
    ROOT / "deploy" / "prometheus" / "runbook.md",
]
OPTIONS_TABLE_PAGE = ROOT / "docs" / "user-guide.md"
# The exporter's own families; a name with one of these prefixes in the docs is a metric.
METRIC = re.compile(
    r"(?<![\w:./-])((?:xla|training|torch_compile|torchneuron|neuron_exporter)_[a-z0-9_]*[a-z0-9])(?![\w:./-])"
)
# Paths that are not in a checkout: the wheel carries deploy/ inside the package.
NOT_IN_A_CHECKOUT = {"neuron_exporter/deploy/"}
ALERT = re.compile(r"\b((?:Xla|TorchCompile|TorchNeuron|NeuronExporter)[A-Z][A-Za-z]+)\b")


def page_id(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def prose_and_code(text: str) -> tuple[str, list[str]]:
    """The text outside fenced code blocks, and the inline code spans and lines of code blocks."""
    prose, code, fenced = [], [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif fenced:
            code.append(line.strip())
        else:
            prose.append(line)
            code.extend(re.findall(r"`([^`]+)`", line))
    return "\n".join(prose), code


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives a page's headings (lower case, punctuation dropped, spaces as hyphens, repeats
    numbered), plus explicit <a name> and <a id> ones."""
    prose, _ = prose_and_code(page.read_text())
    found: set[str] = set(re.findall(r'<a (?:name|id)="([^"]+)"', prose))
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*$", prose, flags=re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        found.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return found


def broken_links(page: Path) -> list[str]:
    prose, _ = prose_and_code(page.read_text())
    broken = []
    for link in re.findall(r"\]\(([^)\s]+)\)", prose):
        if "://" in link or link.startswith("mailto:"):
            continue
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        if not target.exists():
            broken.append(link)
        elif anchor and target.suffix == ".md" and anchor not in anchors(target):
            broken.append(link)
    return broken


def missing_paths(page: Path, root: Path = ROOT) -> list[str]:
    """Paths of the repository the page names in code (`deploy/prometheus/runbook.md`, `tests/training/*.py`)
    that are not there."""
    folders = {path.name for path in root.iterdir() if path.is_dir()}
    _, code = prose_and_code(page.read_text())
    named = {path for span in code for path in re.findall(r"(?<![\w/.])[\w.*-]+(?:/[\w.*-]+)*/?", span) if "/" in path}
    return sorted(
        path
        for path in named - NOT_IN_A_CHECKOUT
        if path.split("/")[0] in folders and not any(root.glob(path.rstrip("/")))
    )


def make_targets() -> set[str]:
    return set(re.findall(r"^([a-z][\w-]*)\s*:", (ROOT / "Makefile").read_text(), flags=re.MULTILINE))


def package_text() -> str:
    return "\n".join(path.read_text() for path in sorted((ROOT / "neuron_exporter").rglob("*.py")))


def exported(name: str, code: str) -> bool:
    """A family the exporter serves: in the metric contract, or named in the package's code (where a counter's
    or histogram's name goes without its suffix)."""
    base = re.sub(r"_(total|bucket|sum|count)$", "", name)
    return name in CONTRACT_METRICS or f'"{name}"' in code or f'"{base}"' in code


def alert_names() -> set[str]:
    rules = (ROOT / "deploy" / "prometheus" / "rules").glob("*.yml")
    return {name for path in rules for name in re.findall(r"^\s*- alert: (\w+)", path.read_text(), re.MULTILINE)}


def test_the_options_table_matches_the_code():
    text = OPTIONS_TABLE_PAGE.read_text()
    start = text.index("<!-- options table")
    table = text[text.index("\n", start) + 1 : text.index("<!-- end of options table -->")]
    assert table.strip() == options_table().strip()


def test_the_variables_that_are_no_options_are_documented_beside_the_options():
    text = OPTIONS_TABLE_PAGE.read_text()
    section = text[text.index("## Configuration") : text.index("<!-- options table")]
    assert [name for name in NOT_OPTIONS if f"`{name}`" not in section] == []


def runnable(module: str) -> bool:
    """Whether ``python -m module`` runs a file of the checkout: a module, or a package's ``__main__``."""
    path = ROOT / module.replace(".", "/")
    return path.with_suffix(".py").is_file() or (path / "__main__.py").is_file()


@pytest.mark.parametrize("page", READMES, ids=page_id)
def test_links_and_modules_of_the_docs_exist(page):
    assert broken_links(page) == []
    modules = set(re.findall(r"python3? -m ([a-z_][a-z0-9_.]*)", page.read_text()))
    modules = {m for m in modules if (ROOT / m.split(".")[0]).is_dir()}  # this repository's, not pytest
    assert [m for m in modules if not runnable(m)] == []


@pytest.mark.parametrize("page", READMES, ids=page_id)
def test_the_paths_the_docs_name_exist(page):
    assert missing_paths(page) == []


@pytest.mark.parametrize("page", READMES, ids=page_id)
def test_the_make_targets_the_docs_name_exist(page):
    _, code = prose_and_code(page.read_text())
    named = {match.group(1) for span in code if (match := re.match(r"make ([a-z][\w-]*)", span))}
    assert named - make_targets() == set()


# Only the user documentation: the generator's README and the runbook name its configuration keys, which look like
# metric names (torch_compile_window).
@pytest.mark.parametrize("page", DOCS, ids=page_id)
def test_the_metrics_and_alerts_the_docs_name_exist(page):
    _, code = prose_and_code(page.read_text())
    spans = "\n".join(code)
    package = package_text()
    assert sorted({name for name in METRIC.findall(spans) if not exported(name, package)}) == []
    assert sorted(set(ALERT.findall(page.read_text())) - alert_names()) == []


def reference_rows(text: str) -> dict[str, tuple[str | None, tuple[str, ...]]]:
    """{family: (type, labels)} of every family a table row of the metrics reference names (`name{a,b}`: its own
    labels; a type cell of one type, or of one per name), and {family: (None, ())} of every other one it names."""
    families: dict[str, tuple[str | None, tuple[str, ...]]] = {}
    for line in text.splitlines():
        if line.startswith("| `"):
            cells = [cell.strip() for cell in line.strip("|").split("|")]
            named = re.findall(r"`([a-z_0-9]+)(?:\{([^}]*)\})?`", cells[0])
            types = [kind.strip() for kind in cells[1].split(",")]
            types = types if len(types) == len(named) else types[:1] * len(named)
            for (name, labels), kind in zip(named, types, strict=True):
                families[name] = (kind, tuple(label for label in labels.split(",") if label))
        else:
            for span in prose_and_code(line)[1]:
                for name in METRIC.findall(span):
                    families.setdefault(name, (None, ()))
    return families


def test_the_metrics_reference_and_the_catalogue_list_the_same_families():
    documented = reference_rows((ROOT / "docs" / "metrics.md").read_text())
    assert sorted(set(FAMILIES) - set(documented)) == [], "families of the catalogue missing from docs/metrics.md"
    assert sorted(set(documented) - set(FAMILIES)) == [], "families in docs/metrics.md missing from the catalogue"
    for name, (kind, labels) in documented.items():
        if kind is not None:
            assert (kind, labels) == (FAMILIES[name].type, FAMILIES[name].labels), name


def test_a_family_the_reference_lacks_or_describes_otherwise_is_caught():
    rows = reference_rows(
        "| `xla_steps_total`, `xla_graph_cuts_total{cause}` | counter | ... |\n"
        "| `a_total`, `b` | counter, gauge | ... |\n"
        "The node adds `neuron_exporter_ranks`.\n"
    )
    assert rows == {
        "xla_steps_total": ("counter", ()),
        "xla_graph_cuts_total": ("counter", ("cause",)),
        "a_total": ("counter", ()),
        "b": ("gauge", ()),
        "neuron_exporter_ranks": (None, ()),
    }
    assert rows["xla_graph_cuts_total"] != (
        FAMILIES["xla_graph_cuts_total"].type,
        FAMILIES["xla_graph_cuts_total"].labels,
    )


def test_a_broken_link_a_missing_anchor_and_an_unknown_metric_are_caught(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "# A page\n\n## Where and why\n\n[ok](#where-and-why) [bad](#nowhere) [gone](missing.md)\n\n"
        "```sh\n# not a heading\n```\n[bad too](#not-a-heading) `xla_no_such_family_total` `make no-such-target`\n"
    )
    assert broken_links(page) == ["#nowhere", "missing.md", "#not-a-heading"]
    page.write_text("`tests/test_readme.py`, `tests/*.py`, `docs/`, `tests/no_such_test.py`, `docs/gone/`, a/b\n")
    assert missing_paths(page) == ["docs/gone/", "tests/no_such_test.py"]
    assert not exported("xla_no_such_family_total", package_text())
    assert exported("xla_steps_total", package_text())
    assert "no-such-target" not in make_targets() and "demo" in make_targets()


# -- what the pages say of the code's names and numbers, where they drift apart ---------------------------------

NUMBERS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9}
DASHBOARD_FILES = sorted(path.name for path in DASHBOARDS.glob("*.json"))
RULE_FILES = sorted((ROOT / "deploy" / "prometheus" / "rules").glob("*.yml"))


def section(text: str, heading: str) -> str:
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start : end if end != -1 else len(text)]


def test_the_endpoint_list_names_every_path_an_endpoint_serves():
    from neuron_exporter.web.http_server import HEALTH, LANDING_PAGE

    served = {"/metrics", *HEALTH, *re.findall(r'href="(/[^"]*)"', LANDING_PAGE)}
    text = (ROOT / "deploy" / "README.md").read_text()
    listed = text[text.index("The endpoint serves only") :].split(" to `GET`")[0]
    assert sorted(path for path in served if f"`{path}`" not in listed) == []


def test_the_dashboard_recipes_name_every_dashboard():
    text = (DASHBOARDS / "README.md").read_text()
    recipes = section(text, "## Import the dashboards into Grafana")
    by_hand = recipes[recipes.index("**By hand**") : recipes.index("**With the HTTP API**")]
    assert [name for name in DASHBOARD_FILES if f"`{name}`" not in by_hand] == []
    (loop,) = re.findall(r"for f in ([^;]+); do", recipes)
    assert sorted(loop.split()) == DASHBOARD_FILES
    (copied,) = re.findall(r"copy the (\w+) JSON files", recipes)
    assert NUMBERS[copied] == len(DASHBOARD_FILES)
    table = text[: text.index("## Import")]
    assert [name for name in DASHBOARD_FILES if f"`dashboards/{name}`" not in table] == []
    (regenerated,) = re.findall(r"`make dashboards` regenerates the (\w+) generated files", text)
    assert NUMBERS[regenerated] == len(DASHBOARD_FILES) + len(RULE_FILES)


@pytest.mark.parametrize("page", [ROOT / "README.md", ROOT / "docs" / "deployment.md", DASHBOARDS / "README.md"])
def test_the_number_of_dashboards_the_pages_give_is_right(page):
    said = re.findall(r"\b(\w+) Grafana dashboards\b", " ".join(page.read_text().split()), flags=re.IGNORECASE)
    counts = [NUMBERS[word.lower()] for word in said if word.lower() in NUMBERS]
    assert counts and counts == [len(DASHBOARD_FILES)] * len(counts)


def test_the_generators_modules_are_all_named():
    text = (DASHBOARDS / "README.md").read_text()
    mixin = ROOT / "neuron_exporter" / "mixin"
    modules = [path.name for folder in ("dashboards", "rules") for path in sorted((mixin / folder).glob("[!_]*.py"))]
    assert [name for name in modules if f"`{name}`" not in text] == []


@pytest.mark.parametrize("page", READMES, ids=page_id)
def test_the_generator_run_with_options_is_given_its_output(page):
    """From an installed package, ``python -m neuron_exporter.mixin`` has no checkout to write into."""
    prose, code = prose_and_code(page.read_text())
    spans = code + re.findall(r"`([^`]+)`", " ".join(prose.split()))  # with the spans broken over two lines
    runs = [span for span in spans if "neuron_exporter.mixin --" in span]
    assert [span for span in runs if "--output" not in span] == []


# Families served under their old names for one release: only the metrics reference names them, as such.
DEPRECATED = re.compile(r"\bxla_process_[a-z_]+")


@pytest.mark.parametrize("page", [page for page in READMES if page.name != "metrics.md"], ids=page_id)
def test_the_pages_name_no_deprecated_family(page):
    assert DEPRECATED.findall(page.read_text()) == []


def test_the_collector_values_are_the_parts_of_a_scrape():
    training = ROOT / "neuron_exporter" / "training"
    code = "\n".join(path.read_text() for path in sorted(training.rglob("*.py")))
    parts = set()
    for body in re.findall(r"def parts\(self\)[^:]*:\n\s+return (\{[^}]*\})", code):
        parts |= set(re.findall(r'"(\w+)":', body))
    parts |= set(re.findall(r'"(\w+)": self\._process_families', code))
    parts |= set(re.findall(r'add_part\("(\w+)"', code))
    assert len(parts) >= 6  # what the look-up finds: a part added another way is not seen
    text = (ROOT / "docs" / "metrics.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| `neuron_exporter_collector_success{"))
    listed = set(re.findall(r"`(\w+)`", row.split("|")[3]))
    assert sorted(listed) == sorted(parts)


def test_the_shipped_files_point_at_the_configuration_table_where_it_is():
    page = OPTIONS_TABLE_PAGE.relative_to(ROOT).as_posix() + "#configuration"
    assert "configuration" in anchors(OPTIONS_TABLE_PAGE)
    shipped = [p for p in (ROOT / "deploy").rglob("*") if p.is_file() and p.suffix in (".yaml", ".yml", ".service")]
    mentions = [p for p in shipped if "configuration table" in p.read_text()]
    assert mentions and [p.name for p in mentions if page not in p.read_text().replace("\n# ", " ")] == []


def test_run_says_what_it_attaches_as_the_user_guide_does(capsys):
    from neuron_exporter.cli import main

    with pytest.raises(SystemExit):
        main(["run", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    guide = " ".join(OPTIONS_TABLE_PAGE.read_text().split())
    assert "Every Python process the command starts that imports torch is attached" in guide
    assert "in every Python process that imports torch," in help_text and "torch_xla" not in help_text
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "attached to every torch process it starts" in " ".join(capsys.readouterr().out.split())


COMMAND_PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "deploy" / "README.md"]
COMMAND_PAGES += [DASHBOARDS / "README.md", ROOT / "deploy" / "prometheus" / "runbook.md"]


def command_lines(page: Path) -> tuple[list[str], list[str]]:
    """The arguments of the ``neuron-exporter`` commands a page shows: whole lines of its code blocks, and the
    inline spans of its prose (which may leave arguments out)."""
    text = page.read_text()
    lines, spans, fenced = [], [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif fenced:
            line = re.split(r"\s#|\||&&", line.strip().removeprefix("$ "))[0]
            line = re.sub(r"^(?:[A-Z_]+=\S+\s+)*(?:sudo\s+)?", "", line)
            if line.startswith("neuron-exporter "):
                lines.append(line.removeprefix("neuron-exporter ").strip())
    prose, _ = prose_and_code(text)
    for span in re.findall(r"`([^`]+)`", " ".join(prose.split())):
        if span.startswith("neuron-exporter "):
            spans.append(span.removeprefix("neuron-exporter "))
    return lines, spans


@pytest.mark.parametrize("page", COMMAND_PAGES, ids=page_id)
def test_the_commands_the_docs_show_are_the_command_lines(page):
    """Every command a page shows parses with the real command line: its command, its flags and their values'
    count; a span in the prose names flags of its command."""
    from neuron_exporter.cli import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    lines, spans = command_lines(page)
    refused = []
    for line in lines:
        try:
            parser.parse_args(shlex.split(line))
        except SystemExit:
            refused.append(line)
    assert refused == []
    for span in spans:
        name, *words = span.split()
        assert name in commands, span
        assert [w for w in words if w.startswith("--") and w not in commands[name]._option_string_actions] == []
