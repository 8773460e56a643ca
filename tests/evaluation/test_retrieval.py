"""Our BEIR scorer equals ``mteb.evaluate`` (graded and binary folders, with and without prompts), and the run /
per-query files it writes."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from st_hardneg.data.beir import load_beir
from st_hardneg.testing.beir import make_tiny_beir

mteb = pytest.importorskip("mteb")


def _graded_copy(root: Path) -> Path:
    """Rewrite the test qrels with grades 1 and 2 (every other judgement 2) and add grade-0 judgements."""
    path = root / "qrels" / "test.tsv"
    lines = path.read_text().splitlines()
    out = [lines[0]]
    for number, line in enumerate(lines[1:]):
        query, doc, _ = line.split("\t")
        out.append(f"{query}\t{doc}\t{2 if number % 2 == 0 else 1}")
    first_query = lines[1].split("\t")[0]
    corpus_ids = [json.loads(x)["_id"] for x in (root / "corpus.jsonl").read_text().splitlines()]
    judged = {line.split("\t")[1] for line in lines[1:] if line.split("\t")[0] == first_query}
    out.append(f"{first_query}\t{next(d for d in corpus_ids if d not in judged)}\t0")
    path.write_text("\r\n".join(out) + "\r\n")  # NFCorpus's line ends
    return root


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("beir")
    return {"binary": make_tiny_beir(base / "binary"), "graded": _graded_copy(make_tiny_beir(base / "graded"))}


@pytest.fixture(scope="module")
def text_model_dir(tmp_path_factory, folders) -> Path:
    from st_hardneg.testing import make_text_model_dir

    data = load_beir(folders["binary"])
    texts = [t.replace(":", "").replace(".", "").replace(",", "") for t in [*data.queries.values(),
                                                                           *data.corpus.values()]]
    return make_text_model_dir(tmp_path_factory.mktemp("bert"), [*texts, "query", "passage"])


def _model(path: Path, prompts: bool):
    from st_hardneg.models import load_model

    model = load_model(path, pooling="mean", max_seq_length=64, device="cpu")
    model.prompts = {"query": "query: ", "document": "passage: "} if prompts else {}
    return model


def _mteb_reference(model, root: Path) -> dict[str, float]:
    """``mteb.evaluate`` on a retrieval task built here from the files alone (json / csv, not our reader), with the
    means of mteb's own per-query pytrec_eval scores unrounded (mteb rounds its means to 5 decimals)."""
    from datasets import Dataset
    from mteb.abstasks.retrieval import AbsTaskRetrieval
    from mteb.abstasks.task_metadata import TaskMetadata

    corpus = [json.loads(x) for x in (root / "corpus.jsonl").read_text().splitlines() if x.strip()]
    queries = {json.loads(x)["_id"]: json.loads(x)["text"] for x in (root / "queries.jsonl").read_text().splitlines()}
    qrels: dict[str, dict[str, int]] = {}
    with (root / "qrels" / "test.tsv").open(newline="") as handle:
        for row in list(csv.reader(handle, delimiter="\t"))[1:]:
            qrels.setdefault(row[0], {})[row[1]] = int(row[2])
    qids = sorted(q for q, docs in qrels.items() if any(g > 0 for g in docs.values()))
    captured: dict[str, float] = {}

    class Reference(AbsTaskRetrieval):
        metadata = TaskMetadata(
            name=f"reference-{root.name}", dataset={"path": str(root), "revision": "local"}, description="test",
            category="t2t", modalities=["text"], eval_splits=["test"], eval_langs=["eng-Latn"],
            license="not specified", annotations_creators="human-annotated", dialect=[], sample_creation="found",
            bibtex_citation="", reference="https://example.org", type="Retrieval", main_score="ndcg_at_10")

        def load_data(self, num_proc=None, **kwargs):
            self.dataset = {"default": {"test": {
                "queries": Dataset.from_dict({"id": qids, "text": [queries[q] for q in qids]}),
                "corpus": Dataset.from_dict({"id": [r["_id"] for r in corpus], "title": [r["title"] for r in corpus],
                                             "text": [r["text"] for r in corpus]}),
                "relevant_docs": {q: qrels[q] for q in qids}, "top_ranked": None}}}
            self.data_loaded = True

        def task_specific_scores(self, scores, qrels, results, hf_split, hf_subset):
            for name, key in (("ndcg@10", "ndcg_cut_10"), ("recall@100", "recall_100")):
                captured[name] = 100 * float(np.mean([per_query[key] for per_query in scores.values()]))
            return {}

    result = mteb.evaluate(model, Reference(), cache=None, co2_tracker=False,
                           encode_kwargs={"batch_size": 64, "show_progress_bar": False}, show_progress_bar=False)
    assert not result.exceptions
    captured["mrr@10"] = 100 * float(result.task_results[0].scores["test"][0]["mrr_at_10"])
    captured["rounded_ndcg@10"] = 100 * float(result.task_results[0].scores["test"][0]["ndcg_at_10"])
    return captured


@pytest.mark.parametrize("kind", ["binary", "graded"])
@pytest.mark.parametrize("prompts", [False, True])
def test_evaluate_beir_equals_mteb_evaluate(folders, text_model_dir, kind, prompts):
    from st_hardneg.evaluation.retrieval import evaluate_beir

    model = _model(text_model_dir, prompts)
    task = load_beir(folders[kind]).task("test")
    ours = evaluate_beir(model, [task], max_seq_length=64)[task.name]
    reference = _mteb_reference(model, folders[kind])
    for metric in ("ndcg@10", "mrr@10", "recall@100"):
        assert ours[metric] == pytest.approx(reference[metric], abs=1e-4), metric  # x 100: 1e-6 as a fraction
    assert ours["ndcg@10"] == pytest.approx(reference["rounded_ndcg@10"], abs=1e-3 + 1e-9)


def test_grades_are_gains_and_prompts_change_the_encoding(folders, text_model_dir):
    from st_hardneg.evaluation.retrieval import evaluate_beir

    model = _model(text_model_dir, False)
    graded, binary = (load_beir(folders[k]).task("test") for k in ("graded", "binary"))
    assert any(g == 2 for docs in graded.qrels.values() for g in docs.values())
    assert graded.relevant_docs == binary.relevant_docs  # same relevant sets, only the gains differ
    plain = evaluate_beir(model, [graded], max_seq_length=64)[graded.name]
    as_binary = evaluate_beir(model, [binary], max_seq_length=64)[binary.name]
    assert plain["ndcg@10"] != pytest.approx(as_binary["ndcg@10"], abs=1e-6)
    assert plain["recall@100"] == pytest.approx(as_binary["recall@100"])  # recall counts grade > 0 alike
    prompted = evaluate_beir(_model(text_model_dir, True), [graded], max_seq_length=64)[graded.name]
    assert prompted["ndcg@10"] != pytest.approx(plain["ndcg@10"], abs=1e-6)


def test_a_prompt_name_the_model_does_not_define_is_refused(folders, text_model_dir):
    from st_hardneg.evaluation.retrieval import evaluate_beir

    task = load_beir(folders["binary"]).task("test")
    with pytest.raises(ValueError, match="query_prompt_name 'search_query' is not a prompt of the model"):
        evaluate_beir(_model(text_model_dir, True), [task], query_prompt_name="search_query")


def test_the_trainer_evaluator_scores_its_hits_with_the_same_scorer(folders, text_model_dir):
    from st_hardneg.evaluation.retrieval import LocalRetrievalEvaluator, retrieve

    model = _model(text_model_dir, False)
    task = load_beir(folders["binary"]).task("test")
    evaluator = LocalRetrievalEvaluator(task.queries, task.corpus, task.relevant_docs, name="t", max_seq_length=64)
    scores = evaluator(model)
    ours = retrieve(model, [task], max_seq_length=64)[task.name].scores
    for metric in ("ndcg@10", "mrr@10", "recall@10", "map@100", "accuracy@1"):
        assert 100 * scores[f"t_cosine_{metric}"] == pytest.approx(ours[metric], abs=1e-4), metric


@pytest.mark.parametrize("length", [0, -1, 2.5, True])
def test_retrieve_refuses_a_length_that_encodes_nothing(folders, text_model_dir, length):
    from st_hardneg.evaluation.retrieval import retrieve

    task = load_beir(folders["binary"]).task("test")
    with pytest.raises(ValueError, match=rf"max_seq_length must be an integer >= 1, got {length!r}"):
        retrieve(_model(text_model_dir, False), [task], max_seq_length=length)


def test_a_length_past_the_encoders_positions_encodes_at_its_limit_and_says_so(folders, text_model_dir, caplog):
    """The BEIR protocol's 256 tokens on an encoder with 128 positions: every document far past 128 tokens is
    encoded at 128 (as asking for 128 does), with a warning, instead of failing on the first long text."""
    import dataclasses
    import logging

    from st_hardneg.evaluation.encoding import model_length_limit
    from st_hardneg.evaluation.retrieval import retrieve
    from st_hardneg.models import load_model

    model = _model(text_model_dir, False)
    assert model_length_limit(model) == 128
    task = load_beir(folders["binary"]).task("test")
    task = dataclasses.replace(task, corpus={key: " ".join([text] * 60) for key, text in task.corpus.items()})
    assert min(len(model.tokenizer(text)["input_ids"]) for text in task.corpus.values()) > 256
    at_limit = retrieve(model, [task], max_seq_length=128)[task.name].scores
    with caplog.at_level(logging.WARNING):
        past = retrieve(model, [task], max_seq_length=256)[task.name].scores
    assert past == at_limit
    assert "encoding at 128 tokens, the encoder's limit" in caplog.text and "instead of the 256" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert load_model(text_model_dir, pooling="mean", max_seq_length=256).max_seq_length == 128
    assert "instead of the 256 asked for" in caplog.text
