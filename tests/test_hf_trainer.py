"""A real Hugging Face Trainer run: transformers' own training loop on the XLA CPU device, scraped over HTTP.

Steps are counted as the Trainer counts them, and the graph cut that transformers' masking code makes in every
forward pass (``padding_mask.all()`` under an ``and``: a ``bool()`` of a device tensor) is named at its line in
transformers, with the script's line among its frames. Needs the ``trainer`` extra: ``make test-trainer``.
"""

from __future__ import annotations

import json

import pytest

from conftest import TrainingRun, marked_line, scrape, series, total, SCRIPTS

pytest.importorskip("transformers")
pytestmark = pytest.mark.trainer

STEPS = 12
LOGGING_STEPS = 4


@pytest.fixture(scope="module")
def trainer_run():
    with TrainingRun("hf_trainer.py", str(STEPS), str(LOGGING_STEPS)) as process:
        result = process.result(timeout=900)
        exposition = scrape(result["url"])
        result["diagnosis"] = json.loads(scrape(result["url"].replace("/metrics", "/diagnosis?format=json")))
        result["text"] = scrape(result["url"].replace("/metrics", "/diagnosis"))
        code, stderr = process.finish()
    assert code == 0 and "Traceback" not in stderr, stderr[-3000:]
    return exposition, result


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
    (finding,) = [block for block in result["text"].split("\n\n")
                  if f"{site['location']}: {STEPS} graph cuts by a tensor used as a Python bool" in block]
    assert marked_line(SCRIPTS / "hf_trainer.py", "train") in finding, finding


def test_torch_xla_counts_the_same_graphs_as_the_exporter(trainer_run):
    exposition, result = trainer_run
    graphs = (result["xla"].get("CachedCompile") or 0) + (result["xla"].get("UncachedCompile") or 0)
    assert total(exposition, "xla_recompilations_total") + total(exposition, "xla_new_graphs_total") == \
        result["xla"]["UncachedCompile"]
    assert total(exposition, "xla_graph_cuts_total") <= graphs
