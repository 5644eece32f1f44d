"""Where the files that come with neuron-exporter are: the Grafana dashboards (``dashboards/``) and the deployment
files, among them the Prometheus rules (``deploy/``).

Both folders live at the repository's root, where users browsing it find them and where ``make dashboards``
writes them. A wheel carries them in the package (``neuron_exporter/dashboards``, ``neuron_exporter/deploy``:
pyproject.toml force-includes them). Run from a checkout, an editable install included, the package reads the
checkout's folders; installed from a wheel, its own copies, which nothing ever writes to.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
DASHBOARDS = "dashboards"
DEPLOY = "deploy"
PROJECT_NAME = 'name = "neuron-exporter"'  # the line of pyproject.toml that says a folder is this project's checkout


def checkout() -> Path | None:
    """The root of the source checkout the package runs from, or None when it runs installed from a wheel."""
    pyproject = PACKAGE.parent / "pyproject.toml"
    try:
        if PROJECT_NAME in pyproject.read_text(encoding="utf-8").splitlines():
            return PACKAGE.parent
    except (OSError, UnicodeDecodeError):
        pass
    return None


def root() -> Path:
    """The folder that holds ``dashboards/`` and ``deploy/``: the checkout's root, else the installed package."""
    return checkout() or PACKAGE


def dashboards_dir() -> Path:
    return root() / DASHBOARDS


def deploy_dir() -> Path:
    return root() / DEPLOY
