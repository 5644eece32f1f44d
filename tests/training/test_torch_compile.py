"""torch.compile: compilations, recompilations with the guard that failed, recompile-limit hits and graph breaks,
each named by its source line, for the backends that run on the CPU here (eager, aot_eager, inductor and
torch_xla's openxla), and the same as torch's own records.

Each case runs tests/scripts/compile_cases.py twice, each in its own process and side by side: attached (scraped
over HTTP, /metrics and /diagnosis) and without attach(); torch compiles and breaks the same in both. These run
wherever attach() does: the openxla cases need torch_xla, the others skip only where attach() fails without it.
tests/training/test_torch_compile_records.py reads the same cases in process, with no torch_xla and no attach().
"""

from __future__ import annotations

import functools
import importlib.util
import json
import subprocess
import sys
import tempfile
from collections import Counter

import pytest

from tests.support.exposition import scrape, series, total, uncatalogued
from tests.support.paths import ROOT, SCRIPTS
from tests.support.processes import TrainingRun, marked_line, xla_env

pytestmark = [pytest.mark.training, pytest.mark.compile]

SCRIPT = SCRIPTS / "compile_cases.py"
STEPS = 5
HAS_XLA = importlib.util.find_spec("torch_xla") is not None
needs_xla = pytest.mark.skipif(not HAS_XLA, reason="torch_xla is not installed")
BACKENDS = ["eager", "aot_eager", "inductor", pytest.param("openxla", marks=needs_xla)]


@functools.cache
def attach_failure() -> str | None:
    """Why attach() fails in this environment (None: it works); tried once, in a process of its own."""
    if HAS_XLA:
        return None
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import neuron_exporter, sys; neuron_exporter.attach(port=0, "
            "addr='127.0.0.1', spool_dir=sys.argv[1]); neuron_exporter.detach()",
            tempfile.mkdtemp(),
        ],
        env=xla_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    return None if done.returncode == 0 else (done.stderr.strip().splitlines() or ["no output"])[-1]


def require_attach() -> None:
    failure = attach_failure()
    if failure is not None:
        pytest.skip(f"attach() fails without torch_xla: {failure}")


def line_of(site: str) -> str:
    return marked_line(SCRIPT, site)


def run(scenario: str, backend: str, *args: str, bare: bool = True) -> dict:
    """One case, attached and (unless ``bare`` is false) without attach() beside it: {"metrics", "diagnosis",
    "text" (the /diagnosis page), "torch" (torch's own records, attached), "bare" (the same, without attach()),
    "stderr"}."""
    require_attach()
    attached = TrainingRun("compile_cases.py", scenario, backend, str(STEPS), *args)
    without = TrainingRun("compile_cases.py", scenario, backend, str(STEPS), "--no-attach") if bare else None
    with attached:
        result = attached.result()
        url = result["url"]
        found = {
            "taken_while_training": result["taken_while_training"],
            "metrics": scrape(url),
            "torch": result["torch"],
            "diagnosis": json.loads(scrape(url.replace("/metrics", "/diagnosis?format=json"))),
            "text": scrape(url.replace("/metrics", "/diagnosis")),
            "url": url,
        }
        if scenario == "limit":  # the command, on the live endpoint
            found["command"] = subprocess.run(
                [sys.executable, "-m", "neuron_exporter", "diagnose", url],
                capture_output=True,
                text=True,
                timeout=60,
                cwd=ROOT,
            )
        code, found["stderr"] = attached.finish()
    assert code == 0 and "Traceback" not in found["stderr"], found["stderr"][-3000:]
    if without is not None:
        with without:
            found["bare"] = without.result()["torch"]
            code, stderr = without.finish()
        assert code == 0, stderr[-3000:]
    return found


def compile_part(found: dict) -> dict:
    (rank,) = found["diagnosis"]["ranks"]
    return rank["torch_compile"]


def assert_same_as_torch(found: dict) -> None:
    """The exporter's counts are torch's: compilations, recompilations by function and guard, limit hits, breaks,
    and compile time; and torch compiled and broke exactly as it does without the exporter."""
    metrics, own = found["metrics"], found["torch"]
    assert total(metrics, "torch_compile_compilations_total") == len(own["compilations"])
    recompilations = Counter(location for location, _ in own["recompilations"])
    assert {
        location: sum(
            v for (loc, _), v in series(metrics, "torch_compile_recompilations_total").items() if loc == location
        )
        for location in recompilations
    } == recompilations
    assert total(metrics, "torch_compile_recompilations_total") == len(own["recompilations"])
    assert series(metrics, "torch_compile_recompile_limit_hits_total") == {
        (location,): count for location, count in Counter(own["limit_hits"]).items()
    }
    breaks = Counter(location for location, _ in own["graph_breaks"])
    assert {
        location: count for (location, _), count in series(metrics, "torch_compile_graph_breaks_total").items()
    } == breaks
    assert total(metrics, "torch_compile_compile_seconds_total") == pytest.approx(own["compile_seconds"])
    part = compile_part(found)
    assert part["mode"] == "full" and part["records_missed"] == 0
    assert (part["compilations"], part["recompilations"], part["graph_breaks"]) == (
        len(own["compilations"]),
        len(own["recompilations"]),
        len(own["graph_breaks"]),
    )
    if "bare" in found:
        timeless = {key: value for key, value in own.items() if key != "compile_seconds"}
        assert timeless == {key: value for key, value in found["bare"].items() if key != "compile_seconds"}


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_batch_size_that_changes_is_a_recompilation_by_size_mismatch_at_the_function(backend):
    found = run("shapes", backend)
    assert_same_as_torch(found)
    function = line_of("shapes function")
    recompilations = len(found["torch"]["recompilations"])
    assert recompilations >= 1
    assert series(found["metrics"], "torch_compile_recompilations_total") == {
        (function, "size_mismatch"): recompilations
    }
    assert series(found["metrics"], "torch_compile_compilations_total") == {(function,): recompilations + 1}
    assert total(found["metrics"], "torch_compile_graph_breaks_total") == 0
    (entry,) = compile_part(found)["functions"]
    assert entry["function"] == "shapes" and entry["location"] == function
    last = 4 + recompilations
    assert entry["failed_guards"][-1]["guard"] == (
        f"tensor 'x' size mismatch at index 0. expected {last - 1}, actual {last}"
    )
    plural = "s" if recompilations != 1 else ""  # one without torch_xla: the batch dimension is dynamic after it
    assert (
        f"{function}: {recompilations} torch.compile recompilation{plural} of shapes(): size_mismatch" in found["text"]
    )


def test_a_python_int_that_changes_is_a_recompilation_by_value_changed():
    found = run("int_arg", "eager")
    assert_same_as_torch(found)
    function = line_of("int_arg function")
    recompilations = series(found["metrics"], "torch_compile_recompilations_total")
    assert list(recompilations) == [(function, "value_changed")] and recompilations[(function, "value_changed")] >= 1
    (entry,) = compile_part(found)["functions"]
    # n = 2, 3, ...: the k-th recompilation fails the guard n == k + 1 (every call with torch_xla imported, which turns
    # automatic dynamic shapes off; without it, n is dynamic after the first)
    last = int(recompilations[(function, "value_changed")]) + 1
    assert entry["failed_guards"][-1]["guard"].startswith(f"n == {last} ")


@pytest.mark.parametrize(
    "scenario, reason, backend",
    [
        ("print", "print", "eager"),
        ("branch", "data_dependent_branch", "eager"),
        pytest.param("print", "print", "openxla", marks=needs_xla),
        pytest.param("branch", "data_dependent_branch", "openxla", marks=needs_xla),
    ],
)
def test_a_graph_break_is_named_by_its_line_and_reason(scenario, reason, backend):
    found = run(scenario, backend)
    assert_same_as_torch(found)
    site = line_of(scenario)
    assert [location for location, _ in found["torch"]["graph_breaks"]] == [site]
    assert series(found["metrics"], "torch_compile_graph_breaks_total") == {(site, reason): 1}
    assert total(found["metrics"], "torch_compile_recompilations_total") == 0
    (entry,) = compile_part(found)["graph_break_sites"]
    assert entry["location"] == site and entry["reason"] == reason and entry["count"] == 1
    assert entry["frames"][0].endswith(f"({site})")
    function = "noisy" if scenario == "print" else "branch"
    assert entry["compiling"].startswith(f"{function} ({line_of(scenario + ' function')}, compile id 0/0)")
    assert f"{site}: 1 torch.compile graph break" in found["text"]


def test_a_function_at_the_recompile_limit_is_counted_once_at_its_line():
    found = run("limit", "eager")
    assert_same_as_torch(found)
    function = line_of("limit function")
    assert found["torch"]["limit_hits"] == [function]
    assert series(found["metrics"], "torch_compile_recompile_limit_hits_total") == {(function,): 1}
    assert series(found["metrics"], "torch_compile_recompilations_total") == {(function, "value_changed"): 1}
    assert uncatalogued(found["metrics"]) == []
    assert series(found["metrics"], "torch_compile_compilations_total") == {(function,): 2}
    command = found["command"]
    assert command.returncode == 0, command.stderr
    (line,) = [line for line in command.stdout.splitlines() if line.startswith("torch.compile on ")]
    assert line.startswith(
        "torch.compile on 1 rank: 2 compilations, 1 recompilations, 0 graph breaks, 1 functions at "
        "the recompile limit, "
    )
    assert f"{function}: shifted() hit torch.compile's recompile limit" in command.stdout
    assert "failed guard (value_changed): n == 1 " in command.stdout


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_clean_compiled_training_loop_has_no_graph_break_and_no_recompilation(backend):
    found = run("train", backend)
    assert_same_as_torch(found)
    metrics = found["metrics"]
    assert total(metrics, "torch_compile_graph_breaks_total") == 0
    assert total(metrics, "torch_compile_recompilations_total") == 0
    assert total(metrics, "torch_compile_recompile_limit_hits_total") == 0
    # the compiled module is named by the line that called it (its compiled frame is torch's own wrapper)
    assert series(metrics, "torch_compile_compilations_total") == {(line_of("train call"),): 1}
    assert total(metrics, "torch_compile_compile_seconds_total") > 0
    assert total(metrics, "xla_steps_total") == (STEPS if backend == "openxla" else 0)
    # the last compilation's record (the backward's, compiled at the first backward()) was read at the optimizer step
    # after it, not only at the scrape
    assert found["taken_while_training"]


def test_an_unknown_torch_is_counted_without_lines_and_said_once():
    found = run("shapes", "eager", "--unknown-torch", bare=False)
    metrics = found["metrics"]
    assert series(metrics, "torch_compile_compilations_total") == {("unknown",): len(found["torch"]["compilations"])}
    assert "torch_compile_recompilations_total" not in metrics and "torch_compile_graph_breaks_total" not in metrics
    assert total(metrics, "torch_compile_compile_seconds_total") > 0
    assert series(metrics, "neuron_exporter_torch_compile_readable") == {
        ("compilations",): 1,
        ("compile_seconds",): 1,
        ("source_lines",): 0,
        ("recompilations",): 0,
        ("recompile_limit_hits",): 0,
        ("graph_breaks",): 0,
    }
    said = [line for line in found["stderr"].splitlines() if "neuron-exporter: torch.compile on torch" in line]
    assert len(said) == 1 and "CompilationMetrics lacks a_field_of_a_future_torch" in said[0]
    assert "a shape this exporter does not know" in said[0]
    assert said[0].endswith(
        "still counted: compilations, compile_seconds; not counted: source_lines, "
        "recompilations, recompile_limit_hits, graph_breaks"
    )
    assert compile_part(found)["mode"] == "counting"


@pytest.mark.parametrize(
    "guard, reason",
    [
        ("0/0: tensor 'x' size mismatch at index 0. expected 4, actual 5", "size_mismatch"),
        ("3/1: tensor 'x' stride mismatch at index 1. expected 1, actual 4", "stride_mismatch"),
        ("0/0: tensor 'x' rank mismatch. expected 2, actual 3", "rank_mismatch"),
        ("7/0: tensor 'x' dtype mismatch. expected Float, actual Double", "dtype_mismatch"),
        ("7/2: tensor 'x' requires_grad mismatch. expected requires_grad=1", "requires_grad_mismatch"),
        (
            "0/0: tensor 'x' dispatch key set mismatch. expected DispatchKeySet(CPU), actual DispatchKeySet(XLA)",
            "dispatch_key_mismatch",
        ),
        ("7/4: GLOBAL_STATE changed: grad_mode ", "global_state"),
        ("1/0: n == 2                                  # return x * n  # train.py:10 in step", "value_changed"),
        ("8/1: ___check_type_id(n, 140295891407360)    # def f(x, n): ...", "type_mismatch"),
        ("2/0: ___check_obj_id(self.fn, 140295891407360)", "id_mismatch"),
        ("0/1: 2 <= x.size()[0]", "size_mismatch"),
        # torch 2.11 and later append the user's stack, whose code is not the guard's
        (
            '0/0: n == 0  # return x + n  # train.py:94 in shifted\nUser stack trace:\n  File "train.py", line 94, in '
            "shifted\n    return x.size()[0] + n",
            "value_changed",
        ),
        ("Unable to find recompilation reasons", "other"),
        (None, "other"),
    ],
)
def test_a_failed_guard_is_reduced_to_a_bounded_reason(guard, reason):
    from neuron_exporter.training.torch_compile.reasons import RECOMPILE_REASONS, guard_reason

    assert guard_reason(guard) == reason and reason in RECOMPILE_REASONS


@pytest.mark.parametrize(
    "message, reason",
    [
        ("Failed to trace builtin operator\n  Explanation: ... builtin operator `print` with argument types", "print"),
        ("Data-dependent branching\n  Explanation: Detected data-dependent branching", "data_dependent_branch"),
        ("Unsupported Tensor.item() call with capture_scalar_outputs=False\n", "tensor_value"),
        ("Call to `torch._dynamo.graph_break()`\n", "explicit"),
        ("Skip calling `torch.compiler.disable()`d function\n", "disabled_function"),
        ("Unsupported Tensor.backward() call\n", "autograd"),
        ("Failed to trace builtin operator\n  Explanation: ... builtin operator `setattr`", "store_attr"),
        ("Failed to trace builtin operator\n  Explanation: ... builtin operator `ord`", "unsupported_builtin"),
        ("Unsupported method call\n", "unsupported_call"),
        # torch 2.10 and later say which instruction broke, before the reason
        (
            "Encountered graph break when attempting to trace CALL: a function call, e.g. f(x, y):\n\n"
            "Unsupported method call\n",
            "unsupported_call",
        ),
        ("Attempt to trace generator\n", "other"),
    ],
)
def test_a_graph_break_reason_is_reduced_to_a_bounded_reason(message, reason):
    from neuron_exporter.training.torch_compile.reasons import GRAPH_BREAK_REASONS, break_reason

    assert break_reason(message) == reason and reason in GRAPH_BREAK_REASONS


def test_the_diagnosis_ranks_compile_findings_over_ranks_and_ignores_parts_of_the_wrong_shape():
    from neuron_exporter import diagnosis

    def rank(name: str, part) -> dict:
        return {"rank": name, "local_rank": name, "steps": 10, "sites": [], "torch_compile": part}

    part = {
        "mode": "full",
        "compilations": 3,
        "recompilations": 2,
        "graph_breaks": 1,
        "recompile_limit_hits": 0,
        "compile_seconds": 1.25,
        "functions": [
            {
                "location": "train.py:12",
                "function": "step",
                "compilations": 3,
                "recompilations": {"size_mismatch": 2},
                "recompile_limit_hits": 0,
                "failed_guards": [
                    {
                        "reason": "size_mismatch",
                        "compile_id": "0/2",
                        "guard": "tensor 'x' size mismatch at index 0. expected 5, actual 6",
                    }
                ],
            }
        ],
        "graph_break_sites": [
            {
                "location": "train.py:20",
                "reason": "print",
                "count": 1,
                "message": "Failed to trace builtin operator\n  Explanation: print",
                "frames": ["step (train.py:20)"],
                "compiling": "step (train.py:12, compile id 0/0)",
            }
        ],
    }
    document = diagnosis.merge(
        [
            {"format": 1, "ranks": [rank("0", part), rank("1", part)]},
            {"format": 1, "ranks": [rank("2", "not a part"), rank("3", {"functions": [7]})]},
        ]
    )
    text = diagnosis.render_text(document)
    lines = text.splitlines()
    assert lines[1] == (
        "torch.compile on 2 ranks: 6 compilations, 4 recompilations, 2 graph breaks, 0 functions at "
        "the recompile limit, 2.5 s compiling."
    )
    assert lines[3] == (
        "1. train.py:12: 4 torch.compile recompilations of step(): size_mismatch 4 (ranks 0, 1): 0.20 per step"
    )
    assert "failed guard (size_mismatch): tensor 'x' size mismatch at index 0. expected 5, actual 6" in text
    assert "2. train.py:20: 2 torch.compile graph breaks (print or logging) (ranks 0, 1)\n" in text
    assert "while compiling step (train.py:12, compile id 0/0)" in text
