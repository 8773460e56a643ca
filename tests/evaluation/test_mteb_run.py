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


def test_the_result_cache_never_answers_for_another_folder_with_the_same_task_name(setup, tmp_path):
    import shutil

    from st_hardneg.evaluation.mteb_run import run_mteb
    from st_hardneg.evaluation.mteb_tasks import beir_mteb_task
    from st_hardneg.evaluation.retrieval import evaluate_beir

    data, model = setup
    other = tmp_path / "b" / "tiny"  # the same folder name, so the same task name, and other judgements
    shutil.copytree(data.root, other)
    qrels = other / "qrels" / "test.tsv"
    lines = qrels.read_text().splitlines()
    queries = dict.fromkeys(line.split("\t")[0] for line in lines[1:])  # one judgement each, of another topic
    qrels.write_text("\n".join([lines[0], *(f"{q}\t{1000 + (7 * int(q)) % 48}\t1" for q in queries)]) + "\n")
    changed = load_beir(other)
    kwargs = {"output_dir": tmp_path / "out", "model_name": "org/tiny", "revision": "r1", "use_cache": True,
              "show_progress_bar": False}
    first = run_mteb(model, [beir_mteb_task(data, "test", max_seq_length=64)], **kwargs)
    second = run_mteb(model, [beir_mteb_task(changed, "test", max_seq_length=64)], **kwargs)
    assert first["scores"].keys() == second["scores"].keys() == {"tiny-test-local"}
    expected = evaluate_beir(model, [changed.task("test")], max_seq_length=64)[changed.task("test").name]["ndcg@10"]
    assert second["scores"]["tiny-test-local"] == pytest.approx(expected, abs=1e-4)
    assert abs(second["scores"]["tiny-test-local"] - first["scores"]["tiny-test-local"]) > 1.0
    again = run_mteb(model, [beir_mteb_task(changed, "test", max_seq_length=64)], **kwargs)  # the same data: cached
    # read back from mteb's file (rounded to 5 decimals there): the cache still serves the data it was computed on
    assert again["scores"]["tiny-test-local"] == pytest.approx(second["scores"]["tiny-test-local"], abs=1e-4)
    assert again["scores"] != second["scores"]
