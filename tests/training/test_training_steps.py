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


def test_steps_on_the_cpu_then_on_the_xla_device_are_all_training_steps():
    with TrainingRun("step_loops.py", "cpu_then_xla", str(STEPS)) as run:
        text = scrape(run.result()["url"])
        assert value(text, "xla_steps_total") == STEPS
        assert value(text, "training_steps_total") == 2 * STEPS
        assert value(text, "training_step_duration_seconds_count") == 2 * STEPS
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


# -- rounds of optimizer steps, in process (the hooks call these methods; here the test does) ----------------------


def made(device: str = "cpu", kind=None):
    import torch

    kind = kind or torch.optim.SGD
    return kind([torch.nn.Parameter(torch.zeros(2, device=device))], lr=0.1)


class LazyCounts:
    """The steps a lazy device's source counts itself (``Source.step_counts``)."""

    def __init__(self, steps: int):
        from neuron_exporter.training.histogram import STEP_DURATION_BUCKETS, Histogram

        self.steps, self.optimizer_steps = steps, True
        self.step_duration = Histogram(STEP_DURATION_BUCKETS)
        for _ in range(steps):
            self.step_duration.observe(0.5)


def counted(lazy: dict | None = None):
    from neuron_exporter.training.steps.training_steps import TrainingSteps

    return TrainingSteps((lazy or {}).get)


def served(steps) -> tuple[float, float]:
    """(training_steps_total, the count of training_step_duration_seconds) as a scrape serves them."""
    families = {family.name: family for family in steps.families({"rank": "0"})}
    (total_steps,) = [s.value for s in families["training_steps"].samples]
    (count,) = [s.value for s in families["training_step_duration_seconds"].samples if s.name.endswith("_count")]
    return total_steps, count


@pytest.mark.parametrize("first, second", [(10, 10), (1, 1), (3, 7)])
def test_a_new_optimizer_that_takes_over_counts_each_of_its_steps(first, second):
    import torch

    steps = counted()
    sgd = made()
    steps.on_optimizer_created()
    for _ in range(first):
        steps.on_optimizer_step(sgd)
    adam = made(kind=torch.optim.Adam)
    steps.on_optimizer_created()
    for _ in range(second):
        steps.on_optimizer_step(adam)
    assert served(steps) == (first + second, first + second)


def test_two_optimizers_made_before_training_step_together_once_a_round():
    steps = counted()
    generator, discriminator = made(), made()
    steps.on_optimizer_created()
    steps.on_optimizer_created()
    for _ in range(10):
        steps.on_optimizer_step(discriminator)
        steps.on_optimizer_step(generator)
    assert served(steps) == (10, 10)


def test_steps_on_the_cpu_then_on_a_lazy_device_add_up():
    """The lazy device's source counts its own steps (on XLA: at the step markers); here the ``meta`` device stands
    for it."""
    steps = counted({"meta": LazyCounts(10)})
    eager = made()
    steps.on_optimizer_created()
    for _ in range(10):
        steps.on_optimizer_step(eager)
    lazy = made("meta")
    steps.on_optimizer_created()
    for _ in range(10):
        steps.on_optimizer_step(lazy)
    assert steps.steps == 10  # the lazy device's steps are its source's, not counted twice
    assert served(steps) == (20, 20)
