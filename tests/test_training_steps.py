"""Steps as the user counts them: optimizer steps, whatever the loop's step markers, closures and loaders do."""

from __future__ import annotations

import pytest
from conftest import TrainingRun, scrape, total, value

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
