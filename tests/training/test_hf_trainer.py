"""A real Hugging Face Trainer run: transformers' own training loop on the XLA CPU device, scraped over HTTP.

Steps are counted as the Trainer counts them, and the graph cut that transformers' masking code makes in every
forward pass (``padding_mask.all()`` under an ``and``: a ``bool()`` of a device tensor) is named at its line in
transformers, with the script's line among its frames. Needs the ``trainer`` extra: ``make test-trainer``.
"""

from __future__ import annotations

import json

import pytest

from tests.support.exposition import scrape, series, total
from tests.support.paths import SCRIPTS
from tests.support.processes import TrainingRun, marked_line

pytest.importorskip("transformers")
pytestmark = pytest.mark.trainer

STEPS = 12
LOGGING_STEPS = 4
BATCH = 4


LENGTHS = (16, 24, 32)  # the batch lengths of tests/scripts/hf_trainer.py with dynamic padding


def train(steps: int, logging_steps: int, padding: str = "fixed") -> tuple[str, dict]:
    with TrainingRun("hf_trainer.py", str(steps), str(logging_steps), padding, fresh=True) as process:
        result = process.result(timeout=900)
        exposition = scrape(result["url"])
        result["diagnosis"] = json.loads(scrape(result["url"].replace("/metrics", "/diagnosis?format=json")))
        result["text"] = scrape(result["url"].replace("/metrics", "/diagnosis"))
        code, stderr = process.finish()
    assert code == 0 and "Traceback" not in stderr, stderr[-3000:]
    return exposition, result


@pytest.fixture(scope="module")
def trainer_run():
    return train(STEPS, LOGGING_STEPS)


def assert_every_location_is_the_users_or_transformers(exposition: str) -> None:
    for family in ("xla_new_graphs_total", "xla_recompilations_total", "xla_graph_cuts_total"):
        for key in series(exposition, family):
            # never typing_extensions, functools, accelerate, torch or torch_xla
            assert key[-1].startswith(("transformers/", "tests/scripts/hf_trainer.py:")), (family, key)


def test_steps_are_the_trainers_optimizer_steps(trainer_run):
    exposition, result = trainer_run
    assert result["device"].startswith("xla"), result["device"]
    assert result["global_step"] == STEPS
    assert total(exposition, "xla_steps_total") == STEPS


def test_the_cut_in_transformers_masking_code_is_named_at_its_line(trainer_run):
    exposition, result = trainer_run
    cuts = series(exposition, "xla_graph_cuts_total")  # (cause, location): count
    masking = {key: count for key, count in cuts.items() if key[1].startswith("transformers/masking_utils.py:")}
    assert masking, cuts
    assert {cause for cause, _ in masking} == {"bool"}, masking
    assert sum(masking.values()) == STEPS, masking  # one forward pass per step
    assert total(exposition, "xla_fragmented_steps_total") == STEPS
    # every other cut is named too: the logging steps' xm.mesh_reduce of the loss (a sync of chosen tensors)
    others = {key: count for key, count in cuts.items() if key not in masking}
    assert {cause for cause, _ in others} <= {"sync_tensors", "item"}, cuts
    assert sum(count for (cause, _), count in others.items() if cause == "sync_tensors") == STEPS // LOGGING_STEPS
    (rank,) = result["diagnosis"]["ranks"]
    (site,) = [s for s in rank["sites"] if s["location"] in {location for _, location in masking}]
    # the detail goes from transformers' line up to the line of the script that started training
    assert site["frames"][0].endswith(f"({site['location']})"), site["frames"]
    assert site["frames"][-1] == f"<module> ({marked_line(SCRIPTS / 'hf_trainer.py', 'train')})", site["frames"]
    (finding,) = [
        block
        for block in result["text"].split("\n\n")
        if f"{site['location']}: {STEPS} graph cuts by a tensor used as a Python bool" in block
    ]
    assert marked_line(SCRIPTS / "hf_trainer.py", "train") in finding, finding


def test_torch_xla_counts_the_same_graphs_as_the_exporter(trainer_run):
    exposition, result = trainer_run
    graphs = (result["xla"].get("CachedCompile") or 0) + (result["xla"].get("UncachedCompile") or 0)
    assert (
        total(exposition, "xla_recompilations_total") + total(exposition, "xla_new_graphs_total")
        == result["xla"]["UncachedCompile"]
    )
    assert total(exposition, "xla_graph_cuts_total") <= graphs


def test_the_trainers_flops_count_exactly_and_compile_no_graph_more(trainer_run):
    """The step's work is sampled on the XLA device (a dispatch mode over a lazy step) and traces the same graphs as
    the run without the exporter."""
    exposition, result = trainer_run
    assert total(exposition, "training_flops_total") == result["expected_flops"] > 0
    with TrainingRun("hf_trainer.py", str(STEPS), str(LOGGING_STEPS), "fixed", "--detached", fresh=True) as process:
        detached = process.result(timeout=900)
        code, stderr = process.finish()
    assert code == 0, stderr[-3000:]
    assert result["xla"]["UncachedCompile"] == detached["xla"]["UncachedCompile"]
    assert result["xla"]["CachedCompile"] == detached["xla"]["CachedCompile"]


@pytest.mark.parametrize("logging_steps", [LOGGING_STEPS, 1])
def test_fixed_shapes_never_recompile_whenever_the_trainer_logs(trainer_run, logging_steps):
    # The logging steps compile graphs of their own (a mesh_reduce of the loss, the step after it) at their first
    # logging step, whether that is step 1 or step 4: new graphs either way, and cache hits from then on.
    exposition, result = trainer_run if logging_steps == LOGGING_STEPS else train(STEPS, logging_steps)
    assert total(exposition, "xla_recompilations_total") == 0, series(exposition, "xla_recompilations_total")
    assert total(exposition, "xla_new_graphs_total") == result["xla"]["UncachedCompile"]
    assert total(exposition, "xla_steps_total") == result["global_step"] == STEPS
    assert_every_location_is_the_users_or_transformers(exposition)


def test_dynamic_padding_recompiles_once_for_each_new_batch_length(trainer_run):
    exposition, result = train(STEPS, LOGGING_STEPS, "dynamic")
    recompilations = series(exposition, "xla_recompilations_total")
    # Dynamic padding adds no computation to the same run with fixed shapes: each computation whose inputs are the
    # batch compiles as a new graph for the first length it sees and recompiles for each of the two others.
    fixed, _ = trainer_run
    assert total(exposition, "xla_new_graphs_total") == total(fixed, "xla_new_graphs_total")
    assert total(exposition, "xla_new_graphs_total") + sum(recompilations.values()) == result["xla"]["UncachedCompile"]
    assert sum(recompilations.values()) >= 2 * (len(LENGTHS) - 1), recompilations
    assert sum(recompilations.values()) % (len(LENGTHS) - 1) == 0, recompilations
    assert any(location.startswith("transformers/trainer.py:") for (location,) in recompilations), recompilations
    assert_every_location_is_the_users_or_transformers(exposition)
    (rank,) = result["diagnosis"]["ranks"]
    for site in rank["sites"]:
        for change in site["recompilation_causes"]:  # the batch's length, old -> new
            assert change["cause"] == "uploads changed shape", site
            (shapes,) = change["uploads"].values()
            assert {shapes["before"], shapes["now"]} <= {f"({BATCH}, {length})" for length in LENGTHS}, site
