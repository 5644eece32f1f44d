"""torch.compile, read by TorchCompileSource in this process and compared with dynamo's own records here: no
torch_xla and no attach() needed, so these run on every torch the exporter reads (torch 2.9 in .venv, the newest
in .venv-torch-latest: `make test-compile-latest`).

Each test resets dynamo first (a fresh start, compile ids from 0), then installs a source of its own. torch's own
account: its compilation records (``get_compilation_metrics()``) and its graph-break log (one record per graph break,
on the ``graph_breaks`` artifact logger).
"""

from __future__ import annotations

import io
import logging
import re
from pathlib import Path

import pytest

pytest.importorskip("torch")
import torch
import torch._dynamo
from torch._dynamo.utils import clear_compilation_metrics, get_compilation_metrics

from neuron_exporter.training.torch_compile import probes
from neuron_exporter.training.torch_compile.diagnosis import torch_compile_part
from neuron_exporter.training.torch_compile.source import TorchCompileSource

pytestmark = pytest.mark.compile

HERE = Path(__file__)
sink = io.StringIO()


class GraphBreakLog(logging.Handler):
    """dynamo's graph-break log: [(file name:line, reason)], one per graph break."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.breaks: list[tuple[str, str]] = []

    def emit(self, record):
        message = record.getMessage()
        where = re.search(r"in user code at (.+?):(\d+)", message)
        reason = re.search(r"Graph Break Reason: (.*)", message)
        self.breaks.append(
            (f"{Path(where.group(1)).name}:{where.group(2)}" if where else None, reason.group(1) if reason else None)
        )


@pytest.fixture
def graph_break_log():
    logger = logging.getLogger("torch._dynamo.symbolic_convert.__graph_breaks")
    handler, level, propagate = GraphBreakLog(), logger.level, logger.propagate
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)
    logger.propagate = propagate


def fresh_dynamo() -> None:
    """As if in a new process (dynamo's reset also removes every compile callback: done before a source installs)."""
    torch._dynamo.reset()
    clear_compilation_metrics()


@pytest.fixture
def source():
    fresh_dynamo()
    found = TorchCompileSource(max_site_series=50, on_error=pytest.fail)
    found.install()
    yield found
    found.uninstall()
    fresh_dynamo()


def marked(site: str) -> str:
    """``file:line`` of the line of this file marked ``# site: <site>``."""
    for number, text in enumerate(HERE.read_text().splitlines(), start=1):
        if text.endswith(f"# site: {site}"):
            return f"{HERE.name}:{number}"
    raise AssertionError(f"no line marked {site}")


def series(source: TorchCompileSource, name: str) -> dict[tuple, float]:
    """{(label values, the location as file name:line): value} of one family, as a scrape shows it."""
    found = {}
    for family in source.parts()["torch_compile"]({}):
        for sample in family.samples:
            if sample.name == name:
                labels = {k: (Path(v).name if k == "location" else v) for k, v in sample.labels.items()}
                found[tuple(labels[k] for k in sorted(labels))] = sample.value
    return found


def dynamo_records() -> dict:
    """torch's own account: compilations and recompilations are the unique compile ids of the records that name a
    code object (a backward graph's record shares its forward's id); compile time is the sum over all records."""
    records = [r for r in get_compilation_metrics() if not r.is_runtime]
    named = [r for r in records if r.co_filename]
    return {
        "compilations": len({r.compile_id for r in named}),
        "recompilations": len({r.compile_id for r in named if r.recompile_reason}),
        "functions": {f"{Path(r.co_filename).name}:{r.co_firstlineno}" for r in named},
        "compile_seconds": sum((r.duration_us or 0) / 1e6 for r in records),
        "unnamed": [r for r in records if not r.co_filename],
    }


def assert_full(source: TorchCompileSource) -> None:
    assert source.mode == "full" and source.readable == probes.READABLE
    assert series(source, "neuron_exporter_torch_compile_readable") == {(name,): 1.0 for name in probes.READABLE}


# -- the compiled code: each marked line is one the tests look for ---------------------------------------------------
def shapes(x):  # site: shapes function
    return torch.relu(x) * 2 + 1


def noisy(x):  # site: print function
    y = x * 2
    print("noisy", y.shape, file=sink)  # site: print
    return y + 1


def branch(x):  # site: branch function
    if x.sum() > 0:  # site: branch
        return x * 2
    return -x


def shifted(x, n):  # site: limit function
    return x + n


def run_shapes(backend: str = "eager") -> None:
    compiled = torch.compile(shapes, backend=backend)
    # torch's default, which importing torch_xla (another test in this process) turns off: one recompilation, then
    # the batch dimension is dynamic
    with torch._dynamo.config.patch(automatic_dynamic_shapes=True):
        for step in range(5):
            compiled(torch.randn(4 + step, 8))  # a new batch size every step


def run_breaks(function) -> None:
    compiled = torch.compile(function, backend="eager")
    x = torch.ones(4, 8)
    for _ in range(3):
        compiled(x)


def run_limit() -> None:
    with torch._dynamo.config.patch(recompile_limit=2):
        compiled = torch.compile(shifted, backend="eager", dynamic=False)  # every new n is a new graph
        x = torch.randn(4, 8)
        for step in range(5):
            compiled(x, step)


def train(batches=(8, 8, 8, 5), backend: str = "aot_eager") -> None:
    """A compiled module trained with AdamW; the last batch is smaller (the end of an epoch)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    compiled = torch.compile(model, backend=backend)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for size in batches:
        x, y = torch.randn(size, 16), torch.randint(0, 4, (size,))
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(compiled(x), y)  # site: train call
        loss.backward()
        optimizer.step()


# -- the tests -------------------------------------------------------------------------------------------------------
def test_each_private_api_has_a_shape_the_exporter_reads_on_this_torch():
    """Fails on a torch whose dynamo changed: check torch_compile/probes.py against that torch's dynamo (the compilation
    records, log_graph_break, the compile callbacks) and add an adapter for the new shape."""
    assert probes.probe_records() is None
    assert probes.probe_callbacks() is None
    hook, problem = probes.probe_graph_breaks()
    assert problem is None and hook is not None


def test_a_batch_size_that_changes_is_a_recompilation_by_size_mismatch_at_the_function(source):
    run_shapes()
    own = dynamo_records()
    function = marked("shapes function")
    assert own["functions"] == {function} and own["recompilations"] >= 1
    assert series(source, "torch_compile_recompilations_total") == {(function, "size_mismatch"): own["recompilations"]}
    assert series(source, "torch_compile_compilations_total") == {(function,): own["compilations"]}
    assert series(source, "torch_compile_graph_breaks_total") == {}
    assert series(source, "torch_compile_compile_seconds_total")[()] == pytest.approx(own["compile_seconds"])
    (entry,) = torch_compile_part(source)["functions"]
    assert entry["function"] == "shapes" and Path(entry["location"]).name == function
    assert entry["failed_guards"][0] == {
        "reason": "size_mismatch",
        "compile_id": "0/1",
        "guard": "tensor 'x' size mismatch at index 0. expected 4, actual 5",
    }
    assert_full(source)


@pytest.mark.parametrize("function, reason", [(noisy, "print"), (branch, "data_dependent_branch")])
def test_a_graph_break_is_named_by_its_line_and_reason(source, graph_break_log, function, reason):
    run_breaks(function)
    site = marked("print" if function is noisy else "branch")
    assert [where for where, _ in graph_break_log.breaks] == [site]  # torch's own: one graph break, at that line
    assert series(source, "torch_compile_graph_breaks_total") == {(site, reason): 1}
    assert series(source, "torch_compile_recompilations_total") == {}
    own = dynamo_records()
    assert sum(series(source, "torch_compile_compilations_total").values()) == own["compilations"] == 2
    (entry,) = torch_compile_part(source)["graph_break_sites"]
    assert Path(entry["location"]).name == site and entry["reason"] == reason and entry["count"] == 1
    assert entry["frames"][0].startswith(f"{function.__name__} (") and entry["frames"][0].endswith(f"{site})")
    first = marked(("print" if function is noisy else "branch") + " function")
    assert re.fullmatch(rf"{function.__name__} \(.*{re.escape(first)}, compile id 0/0\)", entry["compiling"])
    assert not entry["message"].startswith("Encountered graph break")  # the reason itself, as on torch 2.9
    assert_full(source)


def test_a_function_at_the_recompile_limit_is_counted_once_at_its_line(source):
    run_limit()
    function = marked("limit function")
    own = dynamo_records()
    assert len(own["unnamed"]) == 1  # the record of the compilation refused at the limit
    assert series(source, "torch_compile_recompile_limit_hits_total") == {(function,): 1}
    assert series(source, "torch_compile_recompilations_total") == {(function, "value_changed"): 1}
    assert own["compilations"] == 2 and series(source, "torch_compile_compilations_total") == {(function,): 2}
    (entry,) = torch_compile_part(source)["functions"]
    assert entry["recompile_limit_hits"] == 1 and entry["failed_guards"][-1]["recompile_limit_hit"] is True
    guard = entry["failed_guards"][-1]["guard"]
    assert guard.startswith("n == 1 ") and guard.endswith(" in shifted")  # the guard, without torch 2.11's stack


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])  # inductor: its own compile records (seconds here)
def test_a_compiled_module_trained_with_adamw_is_counted_as_dynamo_records_it(source, backend):
    train(backend=backend)
    own = dynamo_records()
    call = marked("train call")
    # the compiled module is named by the line that called it (its compiled frame is torch's own wrapper)
    assert series(source, "torch_compile_compilations_total") == {(call,): own["compilations"]}
    assert own["recompilations"] >= 1  # the last, smaller batch
    assert series(source, "torch_compile_recompilations_total") == {(call, "size_mismatch"): own["recompilations"]}
    assert series(source, "torch_compile_graph_breaks_total") == {}
    assert series(source, "torch_compile_recompile_limit_hits_total") == {}
    assert series(source, "torch_compile_compile_seconds_total")[()] == pytest.approx(own["compile_seconds"])
    assert own["compile_seconds"] > 0 and torch_compile_part(source)["records_missed"] == 0
    assert_full(source)


def test_reset_loops_name_each_module_by_its_own_line_and_keep_no_more_than_the_ring(source):
    """torch._dynamo.reset() before each compilation (compile ids from 0 again), of two modules called from two
    lines, more often than dynamo's ring of records holds: each compilation at its own line, and the source keeps
    no more per compilation than the ring does (nothing of a compilation dynamo forgot)."""
    first, second = torch.nn.Linear(8, 4), torch.nn.Linear(8, 4)
    compiled_first, compiled_second = torch.compile(first, backend="eager"), torch.compile(second, backend="eager")
    x = torch.ones(2, 8)
    ring = torch._dynamo.utils._compilation_metrics.maxlen
    loops = ring // 2 + 4
    for _ in range(loops):
        torch._dynamo.reset()
        compiled_first(x)  # site: reset first
        torch._dynamo.reset()
        compiled_second(x)  # site: reset second
    source.poll()
    assert series(source, "torch_compile_compilations_total") == {
        (marked("reset first"),): loops,
        (marked("reset second"),): loops,
    }
    assert len(source._seen) <= ring and not source._callers


def workload() -> None:
    run_shapes()
    run_breaks(noisy)
    run_breaks(branch)
    run_limit()
    train()


def own_account(graph_break_log: GraphBreakLog) -> dict:
    """Everything dynamo recorded, but times."""
    return {
        "records": [
            (r.compile_id, r.co_name, r.co_firstlineno, r.is_forward, r.recompile_reason, r.fail_type, r.graph_op_count)
            for r in get_compilation_metrics()
        ],
        "graph_breaks": list(graph_break_log.breaks),
    }


def test_the_exporter_adds_no_graph_break_and_no_recompilation(graph_break_log):
    fresh_dynamo()
    workload()
    bare = own_account(graph_break_log)
    fresh_dynamo()
    graph_break_log.breaks.clear()
    read = TorchCompileSource(on_error=pytest.fail)
    read.install()
    try:
        workload()
        assert own_account(graph_break_log) == bare
        assert len(bare["graph_breaks"]) == 2 and sum(series(read, "torch_compile_graph_breaks_total").values()) == 2
    finally:
        read.uninstall()
        fresh_dynamo()


def test_an_unknown_graph_break_call_leaves_the_rest_counted_and_is_said_once(monkeypatch, caplog, graph_break_log):
    """A torch whose log_graph_break has a shape no adapter reads: compilations, recompilations and limits are
    still counted by line, graph breaks are not, and one log line and the readable metric say so."""
    monkeypatch.setattr(probes, "BREAK_SHAPES", {})
    fresh_dynamo()
    read = TorchCompileSource(on_error=pytest.fail)
    with caplog.at_level(logging.WARNING, logger="neuron_exporter"):
        read.install()
    try:
        run_shapes()
        run_breaks(noisy)
        assert len(graph_break_log.breaks) == 1  # the graph break dynamo found, not counted
        said = [r.getMessage() for r in caplog.records if "torch.compile" in r.getMessage()]
        assert len(said) == 1 and "a shape this exporter does not know" in said[0]
        assert said[0].endswith("not counted: graph_breaks")
        assert read.mode == "partial"
        readable = series(read, "neuron_exporter_torch_compile_readable")
        assert readable == {(name,): float(name != "graph_breaks") for name in probes.READABLE}
        assert "torch_compile_graph_breaks_total" not in {f.name + "_total" for f in read.parts()["torch_compile"]({})}
        own = dynamo_records()
        assert sum(series(read, "torch_compile_compilations_total").values()) == own["compilations"]
        assert series(read, "torch_compile_recompilations_total") == {
            (marked("shapes function"), "size_mismatch"): own["recompilations"]
        }
    finally:
        read.uninstall()
        fresh_dynamo()


def test_unknown_compilation_records_are_counted_from_the_callbacks_without_lines(monkeypatch, caplog):
    """A torch whose compilation records lack a field read: compilations and their time are counted from the
    compile callbacks (location="unknown"), graph breaks still by line."""
    monkeypatch.setattr(probes, "RECORD_FIELDS", probes.RECORD_FIELDS + ("a_field_of_a_future_torch",))
    fresh_dynamo()
    read = TorchCompileSource(on_error=pytest.fail)
    with caplog.at_level(logging.WARNING, logger="neuron_exporter"):
        read.install()
    try:
        run_shapes()
        run_breaks(noisy)
        said = [r.getMessage() for r in caplog.records if "torch.compile" in r.getMessage()]
        assert len(said) == 1 and "CompilationMetrics lacks a_field_of_a_future_torch" in said[0]
        assert read.mode == "counting" and torch_compile_part(read)["mode"] == "counting"
        own = dynamo_records()
        # one compile window per frame dynamo compiles: the function's compilations, the print's two frames
        assert series(read, "torch_compile_compilations_total") == {("unknown",): own["compilations"]}
        assert series(read, "torch_compile_graph_breaks_total") == {(marked("print"), "print"): 1}
        shown = {f.name + "_total" for f in read.parts()["torch_compile"]({})}
        assert "torch_compile_recompilations_total" not in shown
        assert series(read, "torch_compile_compile_seconds_total")[()] > 0
    finally:
        read.uninstall()
        fresh_dynamo()
