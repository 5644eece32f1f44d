"""`neuron-exporter run -- COMMAND`: the exporter in every torch_xla process of any command, no code changed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from neuron_exporter.node.spool_reader import read_rank_file
from tests.support.daemon import free_port
from tests.support.exposition import scrape, value
from tests.support.paths import ROOT, SCRIPTS
from tests.support.processes import wait_until, xla_env
from tests.support.rank_files import only_rank_file

pytestmark = pytest.mark.training

TORCHRUN = Path(sys.executable).parent / "torchrun"
NOBODY = 65534
CLI = [sys.executable, "-m", "neuron_exporter"]
SYSTEM_PYTHON = Path("/usr/bin/python3")
NOT_ATTACHED = "neuron-exporter: not attached: "


def start(tmp_path, command: list[str], port: int, **env: str) -> subprocess.Popen:
    environment = xla_env(NEURON_EXPORTER_SPOOL_INTERVAL_SECONDS="0.1", **env)
    return subprocess.Popen(
        CLI
        + ["run", "--addr", "127.0.0.1", "--port", str(port), "--spool-dir", str(tmp_path / "spool"), "--", *command],
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def steps_by_rank(url: str) -> dict[str, float]:
    try:
        text = scrape(url)
    except OSError:
        return {}
    return {
        rank: value(text, "xla_steps_total", rank=rank)
        for rank in ("0", "1")
        if value(text, "xla_steps_total", rank=rank) is not None
    }


@pytest.mark.skipif(not TORCHRUN.exists(), reason="torchrun is not installed next to this Python")
def test_every_torchrun_rank_of_a_plain_script_is_on_one_endpoint(tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    command = [
        str(TORCHRUN),
        "--standalone",
        "--nproc-per-node",
        "2",
        str(SCRIPTS / "plain_train.py"),
        str(tmp_path),
        "4",
    ]
    process = start(tmp_path, command, port)
    try:
        wait_until(lambda: steps_by_rank(url) == {"0": 4, "1": 4}, timeout=240, what="both ranks' steps")
        text = scrape(url)
        assert value(text, "neuron_exporter_rank_up", rank="0") == value(text, "neuron_exporter_rank_up", rank="1") == 1
        (tmp_path / "release").write_text("")
        _, stderr = process.communicate(timeout=120)
    finally:
        process.kill()
    assert process.returncode == 0, stderr[-3000:]
    assert "Traceback" not in stderr and "cannot listen" not in stderr, stderr[-3000:]
    for rank in ("0", "1"):
        assert read_rank_file(only_rank_file(tmp_path / "spool", rank)).meta.finished


@pytest.mark.skipif(not TORCHRUN.exists(), reason="torchrun is not installed next to this Python")
def test_diagnose_lists_the_sites_of_both_ranks_of_a_live_torchrun_job(tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    command = [
        str(TORCHRUN),
        "--standalone",
        "--nproc-per-node",
        "2",
        str(SCRIPTS / "plain_train.py"),
        str(tmp_path),
        "4",
        "item",
    ]
    process = start(tmp_path, command, port)
    try:
        wait_until(lambda: steps_by_rank(url) == {"0": 4, "1": 4}, timeout=240, what="both ranks' steps")
        site = f"tests/scripts/plain_train.py:{line_of_item()}"  # relative to the job's working directory
        result = subprocess.run(
            CLI + ["diagnose", f"127.0.0.1:{port}"], capture_output=True, text=True, timeout=60, cwd=ROOT
        )
        assert result.returncode == 0, result.stderr
        goodput = result.stdout.splitlines()[1]  # the run's goodput, over both ranks, opens the diagnosis
        assert goodput.startswith("Run ") and ", 2 ranks: goodput " in goodput, result.stdout
        first = next(line for line in result.stdout.splitlines() if line.startswith("1. "))
        assert first == f"1. {site}: 8 graph cuts by .item() (ranks 0, 1): 1.00 per step", result.stdout
        as_json = subprocess.run(
            CLI + ["diagnose", url, "--format", "json"], capture_output=True, text=True, timeout=60, cwd=ROOT
        )
        ranks = json.loads(as_json.stdout)["ranks"]
        assert [(r["rank"], [s["location"] for s in r["sites"] if s["graph_cuts"]]) for r in ranks] == [
            ("0", [site]),
            ("1", [site]),
        ]
        (tmp_path / "release").write_text("")
        process.communicate(timeout=120)
    finally:
        process.kill()


def line_of_item() -> int:
    lines = (SCRIPTS / "plain_train.py").read_text().splitlines()
    return next(number for number, line in enumerate(lines, start=1) if line.endswith("# site: item"))


def test_the_exit_code_and_signals_of_the_command_pass_through(tmp_path):
    port = free_port()
    done = start(tmp_path, [sys.executable, "-c", "import sys; sys.exit(7)"], port)
    assert done.wait(timeout=120) == 7
    sleeper = start(tmp_path, [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(600)"], port)
    try:
        assert sleeper.stdout.readline().strip() == "up"
        sleeper.send_signal(signal.SIGTERM)
        assert sleeper.wait(timeout=60) == 128 + signal.SIGTERM  # the command died of the forwarded SIGTERM
    finally:
        sleeper.kill()


def test_a_process_that_never_imports_torch_xla_is_untouched(tmp_path):
    port = free_port()
    probe = (
        "import sys, threading; print(sorted(m for m in ('torch_xla', 'neuron_exporter.training.attach', "
        "'prometheus_client') if m in sys.modules), threading.active_count())"
    )
    process = start(tmp_path, [sys.executable, "-c", probe], port)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 0 and stdout.strip() == "[] 1", stderr  # only an import watcher was installed


def test_neuron_exporter_auto_attaches_a_plain_python_script(tmp_path):
    """For users who can set a variable but not change the command line: the .pth file installed with the
    package attaches every process that imports torch_xla."""
    port = free_port()
    env = xla_env(
        NEURON_EXPORTER_AUTO="1",
        NEURON_EXPORTER_PORT=str(port),
        NEURON_EXPORTER_ADDR="127.0.0.1",
        NEURON_EXPORTER_SPOOL_DIR=str(tmp_path / "spool"),
        NEURON_EXPORTER_SPOOL_INTERVAL_SECONDS="0.1",
    )
    env.pop("PYTHONPATH")  # nothing but the variable
    process = subprocess.Popen(
        [sys.executable, str(SCRIPTS / "plain_train.py"), str(tmp_path), "3"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        wait_until(lambda: steps_by_rank(url) == {"0": 3}, timeout=120, what="the script's steps")
        (tmp_path / "release").write_text("")
        _, stderr = process.communicate(timeout=120)
    finally:
        process.kill()
    assert process.returncode == 0 and "Traceback" not in stderr, stderr[-3000:]
    assert read_rank_file(only_rank_file(tmp_path / "spool", "0")).meta.finished


def test_a_spool_directory_of_another_user_costs_the_job_nothing(tmp_path):
    """Anyone can lay a directory where the spool goes: the command still runs, and the rank that holds the port
    serves itself there, saying the spool is not used."""
    (tmp_path / "spool").mkdir(mode=0o700)
    os.chown(tmp_path / "spool", NOBODY, NOBODY)
    port = free_port()
    process = start(tmp_path, [sys.executable, str(SCRIPTS / "plain_train.py"), str(tmp_path), "3"], port)
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        wait_until(lambda: steps_by_rank(url) == {"0": 3}, timeout=120, what="the rank to serve its steps")
        assert value(scrape(url), "neuron_exporter_spool_directory_ok") == 0
        (tmp_path / "release").write_text("")
        _, stderr = process.communicate(timeout=120)
    finally:
        process.kill()
    assert process.returncode == 0 and "Traceback" not in stderr, stderr[-3000:]
    assert stderr.count("running the command anyway") == 1
    assert os.listdir(tmp_path / "spool") == []


def test_no_command_is_one_line_and_exit_2():
    result = subprocess.run(CLI + ["run"], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert result.returncode == 2 and result.stderr.count("\n") == 1


def run_plainly(tmp_path, command: list) -> subprocess.CompletedProcess:
    """``neuron-exporter run`` of this checkout as a user runs it: no PYTHONPATH of its own to pass on, so that the
    command's interpreters see nothing of the package but what ``run`` gives them."""
    return subprocess.run(
        CLI
        + ["run", "--addr", "127.0.0.1", "--port", "0", "--spool-dir", str(tmp_path / "spool"), "--"]
        + [str(part) for part in command],
        env={"PATH": os.environ["PATH"], "PJRT_DEVICE": "CPU"},
        cwd=ROOT,  # where `python -m neuron_exporter` finds this checkout
        capture_output=True,
        text=True,
        timeout=300,
    )


def cannot_import_the_package(python) -> bool:
    probe = subprocess.run(
        [str(python), "-c", "import neuron_exporter.training"],
        env={"PATH": os.environ["PATH"]},
        capture_output=True,
        cwd="/",
    )
    return probe.returncode != 0


@pytest.mark.skipif(not SYSTEM_PYTHON.exists(), reason="no /usr/bin/python3")
def test_a_python_without_the_package_that_never_imports_torch_stays_silent(tmp_path):
    """A tool or a hook the command runs with another Python inherits run's variables: it says nothing."""
    assert cannot_import_the_package(SYSTEM_PYTHON)
    tool = tmp_path / "tool.py"
    tool.write_text("import json, subprocess, sys\nprint('tool ran', file=sys.stderr)\n")
    result = run_plainly(tmp_path, [SYSTEM_PYTHON, tool])
    assert result.returncode == 0, result.stderr
    assert [line for line in result.stderr.splitlines() if not line.startswith("neuron-exporter run: ")] == ["tool ran"]


@pytest.mark.skipif(not SYSTEM_PYTHON.exists(), reason="no /usr/bin/python3")
def test_a_python_without_the_package_that_imports_torch_says_why_once(tmp_path):
    """A virtual environment not activated: its Python imports torch but not the package. It says so once, naming
    itself and the fix, and its children that never import torch stay silent."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site_packages = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # torch from this environment, read as a plain directory: its .pth files (the package's) are not processed
    Path(site_packages, "torch_of_the_tests.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    assert cannot_import_the_package(python)
    script = tmp_path / "train.py"
    script.write_text(
        "import subprocess, sys\nimport torch\nimport torch.nn\n"
        f"subprocess.run([{str(SYSTEM_PYTHON)!r}, '-c', 'pass'], check=True)\nprint('trained')\n"
    )
    result = run_plainly(tmp_path, [python, script])
    assert (result.returncode, result.stdout) == (0, "trained\n"), result.stderr
    said = [line for line in result.stderr.splitlines() if line.startswith("neuron-exporter: ")]
    assert len(said) == 1, result.stderr
    assert said[0].startswith(f"{NOT_ATTACHED}{python} cannot import neuron_exporter (ModuleNotFoundError: ")
    assert said[0].endswith(
        f"install neuron-exporter into its environment ({python} -m pip install neuron-exporter), or run the "
        "command with the neuron-exporter of the environment that has it"
    )
