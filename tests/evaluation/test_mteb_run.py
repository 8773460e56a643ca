"""run_mteb: retrieval tasks go through mteb's own encoding (prompts by prompt type), results filed under the given
name and revision in a ResultCache at the output folder."""

from __future__ import annotations

import pytest

from st_hardneg.data.beir import load_beir
from st_hardneg.testing.beir import make_tiny_beir

pytest.importorskip("mteb")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from st_hardneg.models import load_model
    from st_hardneg.testing import make_text_model_dir

    root = make_tiny_beir(tmp_path_factory.mktemp("beir") / "tiny")
    data = load_beir(root)
    texts = [t.replace(":", "").replace(".", "").replace(",", "") for t in [*data.queries.values(),
                                                                           *data.corpus.values()]]
    path = make_text_model_dir(tmp_path_factory.mktemp("bert"), [*texts, "query", "passage"])
    model = load_model(path, pooling="mean", max_seq_length=64, device="cpu")
    model.prompts = {"query": "query: ", "document": "passage: "}
    return data, model


def test_run_mteb_applies_the_prompts_as_mteb_evaluate_does(setup, tmp_path):
    import mteb

    from st_hardneg.evaluation.mteb_run import run_mteb
    from st_hardneg.evaluation.mteb_tasks import beir_mteb_task
    from st_hardneg.evaluation.retrieval import evaluate_beir

    data, model = setup
    task = data.task("test")
    prompted = evaluate_beir(model, [task], max_seq_length=64)[task.name]["ndcg@10"]
    result = run_mteb(model, [beir_mteb_task(data, "test", max_seq_length=64)], output_dir=tmp_path,
                      model_name="org/tiny", revision="r1", show_progress_bar=False)
    direct = mteb.evaluate(model, beir_mteb_task(data, "test", max_seq_length=64), cache=None, co2_tracker=False,
                           encode_kwargs={"show_progress_bar": False}, show_progress_bar=False)
    direct_score = 100 * direct.task_results[0].get_score(splits=["test"])
    assert result["scores"]["tiny-test-local"] == pytest.approx(prompted, abs=1e-4)
    assert result["scores"]["tiny-test-local"] == pytest.approx(direct_score, abs=1e-4)
    model.prompts = {}
    try:
        plain = evaluate_beir(model, [task], max_seq_length=64)[task.name]["ndcg@10"]
    finally:
        model.prompts = {"query": "query: ", "document": "passage: "}
    assert abs(plain - prompted) > 1e-3  # the prompts change the score, so the agreement above is not vacuous
    # mteb's own files, under the name and revision given
    assert result["model"] == "org/tiny" and result["revision"] == "r1"
    assert list(tmp_path.glob("results/org__tiny/r1/tiny-test-local.json"))


def test_the_default_revision_is_a_digest_of_the_weights(setup, tmp_path):
    from st_hardneg.evaluation.mteb_run import run_mteb
    from st_hardneg.evaluation.mteb_tasks import beir_mteb_task
    from st_hardneg.models import weights_digest

    data, model = setup
    result = run_mteb(model, [beir_mteb_task(data, "test", max_seq_length=64)], output_dir=tmp_path,
                      show_progress_bar=False)
    assert result["revision"] == f"weights-{weights_digest(model)}" and result["model"] == "local/model"
