"""Steps as the user counts them: optimizer steps, whatever the loop's step markers, closures and loaders do."""

from __future__ import annotations

import json

import pytest

from tests.support.exposition import scrape, series, total, value
from tests.support.paths import SCRIPTS
from tests.support.processes import TrainingRun, marked_line

pytestmark = pytest.mark.training

STEPS = 10
# scenario: (training steps, markers that ran graphs, graphs, graph cuts, fragmented steps)
EXPECTED = {
    # the loader's next batch ends each step; its prefetch syncs run nothing
    "loader": (STEPS, STEPS, STEPS, 0, 0),
    # 4 micro-batch markers and 1 marker after optimizer.step(): 5 graphs per training step, none cut
    "accumulation": (STEPS, 5 * STEPS, 5 * STEPS, 0, 0),
    # a logging .item() every 5 steps cuts that step's graph: one more graph, one fragmented step
    "closure_logging": (STEPS, STEPS, STEPS + STEPS // 5, STEPS // 5, STEPS // 5),
}


@pytest.mark.parametrize("scenario", EXPECTED)
def test_training_steps_markers_graphs_and_cuts_are_exact(scenario):
    steps, markers, graphs, cuts, fragmented = EXPECTED[scenario]
    with TrainingRun("step_loops.py", scenario, str(STEPS)) as run:
        text = scrape(run.result()["url"])
        assert value(text, "xla_steps_total") == steps
        assert value(text, "xla_step_markers_total") == markers
        assert value(text, "xla_graphs_per_step_count") == steps
        assert value(text, "xla_graphs_per_step_sum") == graphs
        assert total(text, "xla_graph_cuts_total") == cuts
        assert value(text, "xla_fragmented_steps_total") == fragmented
        code, stderr = run.finish()
    assert code == 0 and "Traceback" not in stderr


def test_a_script_shaped_like_pytorch_xlas_mnist_counts_optimizer_steps_and_never_recompiles():
    # The initial weights are broadcast before the optimizer exists (a step marker that runs a graph: setup, not a
    # step); each epoch ends with a test loop whose accuracy is read on the host and averaged with mesh_reduce.
    epochs, steps_per_epoch = 3, 6
    with TrainingRun("mnist_shaped.py", str(epochs), str(steps_per_epoch)) as run:
        result = run.result()
        text = scrape(result["url"])
        diagnosis = json.loads(scrape(result["url"].replace("/metrics", "/diagnosis?format=json")))
        code, stderr = run.finish()
    assert code == 0 and "Traceback" not in stderr, stderr[-3000:]
    assert value(text, "xla_steps_total") == result["optimizer_steps"] == epochs * steps_per_epoch
    assert value(text, "xla_step_markers_total") > epochs * steps_per_epoch  # the broadcast and the test loops
    assert total(text, "xla_recompilations_total") == 0, series(text, "xla_recompilations_total")
    assert total(text, "xla_new_graphs_total") == result["xla"]["UncachedCompile"]
    assert (marked_line(SCRIPTS / "mnist_shaped.py", "mesh_reduce"),) in series(text, "xla_new_graphs_total")
    (rank,) = diagnosis["ranks"]
    for site in rank["sites"]:  # never typing_extensions, functools or torch_xla
        assert site["location"].startswith("tests/scripts/mnist_shaped.py:"), site
