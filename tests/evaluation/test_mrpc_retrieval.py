"""Retrieval evidence: the MRPC paraphrase-retrieval task, its evaluator, the mteb task and mined training data."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from st_hardneg.data import DataNotFoundError
from st_hardneg.data.mrpc import (
    MRPC_HEADER,
    MRPCFormatError,
    assert_no_test_leak,
    build_mrpc_retrieval,
    dev_split,
    mine_training_negatives,
    read_mrpc,
)

# (label, id1, id2, sentence 1, sentence 2)
TRAIN = [
    (1, "101", "102", "a man plays the guitar .", "a man is playing a guitar ."),
    (1, "103", "104", "the dog runs in the park .", "a dog is running in a park ."),
    (0, "105", "106", "the sky is blue .", "she writes a letter ."),
    (1, "107", "108", "two children eat bread .", "the children are eating bread ."),
    (1, "109", "110", "snow is cold .", "the snow is very cold ."),
    (0, "111", "112", "people walk to the station .", "people walk in the city ."),
    (1, "113", "114", "rain in the city at night .", "it rains in the city at night ."),
    # shares a sentence with the test task (test query 201): must be excluded from training
    (1, "201", "115", "the cat eats food .", "a cat is eating its food ."),
    (1, "116", "117", "one car drives on the road .", "a car is driving on the road ."),
]
TEST = [
    (1, "201", "202", "the cat eats food .", "the cat is eating food ."),
    (1, "203", "204", "a woman plays the piano .", "a woman is playing the piano ."),
    (0, "205", "206", "the house is red .", "the house is green ."),
    (1, "207", "208", "the sun is hot today .", "today the sun is very hot ."),
    (1, "209", "210", "three apples and water .", "three apples and some water ."),
]


def write_mrpc(root: Path, train=TRAIN, test=TEST) -> Path:
    folder = root / "senteval" / "MRPC"  # the SentEval layout: <data dir>/senteval/MRPC
    folder.mkdir(parents=True, exist_ok=True)
    for name, rows in (("train", train), ("test", test)):
        lines = ["\t".join(MRPC_HEADER)] + ["\t".join(map(str, row)) for row in rows]
        (folder / f"msr_paraphrase_{name}.txt").write_text("\ufeff" + "\n".join(lines) + "\n", encoding="utf8")
    return root


@pytest.fixture(scope="module")
def text_model_dir(tmp_path_factory) -> Path:
    """A tiny random BERT whose WordPiece vocabulary spells any lower-case word (so distinct texts get distinct
    embeddings; conftest's tiny model maps every word to [UNK] under transformers 5)."""
    from st_hardneg.testing import make_text_model_dir

    texts = ["the cat eats", *(f"{row[3]} {row[4]}" for rows in (TRAIN, TEST) for row in rows)]
    return make_text_model_dir(tmp_path_factory.mktemp("tiny-retrieval-bert"), texts)


@pytest.fixture
def text_model(text_model_dir):
    from st_hardneg.models import load_model

    return load_model(text_model_dir, pooling="mean", max_seq_length=32, device="cpu")


# --------------------------------------------------------------------------- reading and task construction
def test_read_mrpc_normalises_and_strips_the_bom(tmp_path):
    root = write_mrpc(tmp_path)
    pairs = read_mrpc(root / "senteval" / "MRPC" / "msr_paraphrase_train.txt")
    assert len(pairs) == len(TRAIN)
    assert pairs[0].label == 1 and pairs[0].id1 == "101" and pairs[0].sentence2 == "a man is playing a guitar ."
    (tmp_path / "ws.txt").write_text("\t".join(MRPC_HEADER) + "\n1\t7\t8\t  a   b \tc  d\n", encoding="utf8")
    pair = read_mrpc(tmp_path / "ws.txt")[0]
    assert (pair.sentence1, pair.sentence2) == ("a b", "c d")


@pytest.mark.parametrize("body, line, fragment", [
    ("1\t7\t8\tonly four fields\n", 2, "5 tab-separated fields"),
    ("1\t7\t8\ta\tb\n2\t9\t10\tc\td\n", 3, "must be 0 or 1"),
    ("1\t7\t8\ta\tb\n0\t9\t10\t \td\n", 3, "empty sentence"),
])
def test_malformed_mrpc_names_file_and_line(tmp_path, body, line, fragment):
    path = tmp_path / "bad.txt"
    path.write_text("\t".join(MRPC_HEADER) + "\n" + body, encoding="utf8")
    with pytest.raises(MRPCFormatError, match=rf"bad\.txt, line {line}: .*{fragment}"):
        read_mrpc(path)


def test_bad_header_missing_file_and_missing_dir(tmp_path):
    (tmp_path / "h.txt").write_text("label\ta\tb\tc\td\n1\t7\t8\ta\tb\n", encoding="utf8")
    with pytest.raises(MRPCFormatError, match=r"h\.txt, line 1: expected the header"):
        read_mrpc(tmp_path / "h.txt")
    with pytest.raises(DataNotFoundError, match="nope.txt"):
        read_mrpc(tmp_path / "nope.txt")
    (tmp_path / "senteval" / "STS").mkdir(parents=True)  # a SentEval dir without MRPC/
    with pytest.raises(DataNotFoundError, match="msr_paraphrase_train.txt"):
        build_mrpc_retrieval(tmp_path)


def test_task_definition_by_hand(tmp_path):
    data = build_mrpc_retrieval(write_mrpc(tmp_path))
    task = data.task
    # queries: sentence 1 of the 4 test paraphrase pairs, id q<id1>
    assert task.queries == {"q201": "the cat eats food .", "q203": "a woman plays the piano .",
                            "q207": "the sun is hot today .", "q209": "three apples and water ."}
    assert task.relevant_docs == {"q201": {"d202"}, "q203": {"d204"}, "q207": {"d208"}, "q209": {"d210"}}
    # corpus: every distinct sentence of both files but the queries; "the cat eats food ." appears in both files
    # (ids 201) and is a query, so it is not a document
    every = {s for rows in (TRAIN, TEST) for row in rows for s in row[3:]}
    assert set(task.corpus.values()) == every - set(task.queries.values())
    assert len(task.corpus) == len(every) - 4
    assert task.corpus["d206"] == "the house is green ." and task.corpus["d102"] == "a man is playing a guitar ."
    # training: train paraphrases minus the one touching the test task
    assert data.train_pairs == [(r[3], r[4]) for r in TRAIN if r[0] == 1 and r[1] != "201"]
    assert data.stats["train_pairs_excluded_test_overlap"] == 1
    assert data.stats["train_sentences_excluded_test_overlap"] == 1
    assert "the cat eats food ." not in data.train_corpus and "a cat is eating its food ." in data.train_corpus
    assert set(data.train_corpus) == {s for r in TRAIN for s in r[3:]} - {"the cat eats food ."}
    assert data.known_paraphrases["snow is cold ."] == {"the snow is very cold ."}
    assert data.known_paraphrases["the snow is very cold ."] == {"snow is cold ."}
    assert "the sky is blue ." not in data.known_paraphrases  # label 0 pairs are not paraphrases


def test_query_that_is_another_querys_relevant_doc_is_handled(tmp_path):
    test = [(1, "301", "302", "x one .", "x two ."), (1, "303", "301", "y one .", "x one .")]
    data = build_mrpc_retrieval(write_mrpc(tmp_path, test=test))
    # "x one ." is a query, so it cannot be a document: query q303 is left without a relevant document and dropped
    assert data.task.queries == {"q301": "x one ."}
    assert data.task.relevant_docs == {"q301": {"d302"}}
    assert data.stats["queries_dropped_no_relevant_left"] == 1
    assert data.stats["relevant_docs_dropped_as_queries"] == 1


def test_leak_check_raises(tmp_path):
    data = build_mrpc_retrieval(write_mrpc(tmp_path))
    assert_no_test_leak(data, data.train_corpus)
    with pytest.raises(ValueError, match="test-task sentence"):
        assert_no_test_leak(data, ["the cat is eating food ."])  # a relevant document
    with pytest.raises(ValueError, match="test-task sentence"):
        assert_no_test_leak(data, ["a woman plays the piano ."])  # a query


# --------------------------------------------------------------------------- dev split
CHAIN_TRAIN = [  # a - b - c chained paraphrases, plus independent pairs
    (1, "401", "402", "alpha one .", "alpha two ."),
    (1, "402", "403", "alpha two .", "alpha three ."),
    *[(1, str(500 + 2 * i), str(501 + 2 * i), f"topic {i} first .", f"topic {i} second .") for i in range(12)],
]


def _check_dev_split(full, dev):
    """Every invariant of a dev split, re-derived from the full split."""
    queries = set(dev.task.queries.values())
    answers = {dev.task.corpus[d] for docs in dev.task.relevant_docs.values() for d in docs}
    for qid, text in dev.task.queries.items():  # relevant = all labelled train paraphrases of the query
        assert {dev.task.corpus[d] for d in dev.task.relevant_docs[qid]} == full.known_paraphrases[text]
    assert not queries & answers  # no query is another query's answer
    assert set(dev.task.corpus.values()) == set(full.train_corpus) - queries
    protected = queries | answers
    assert dev.train_pairs == [p for p in full.train_pairs if not set(p) & protected]
    assert set(dev.train_corpus) == set(full.train_corpus) - protected
    assert dev.protected_sentences() == protected
    assert not protected & full.protected_sentences()  # the test task is never touched
    for text, paraphrases in dev.known_paraphrases.items():
        assert text not in protected and not paraphrases & protected


def test_dev_split_by_hand(tmp_path):
    full = build_mrpc_retrieval(write_mrpc(tmp_path, train=CHAIN_TRAIN))
    assert len(full.train_pairs) == 14
    dev = dev_split(full, fraction=0.25, seed=3)
    assert len(dev.task.queries) == round(0.25 * 14) == 4
    _check_dev_split(full, dev)
    assert dev.stats["dev_queries"] == 4 and dev.stats["train_pairs_kept"] == len(dev.train_pairs)
    assert dev.task.name == "MRPC-dev-retrieval"
    # deterministic for a seed, different for another, never dependent on the file order
    assert dev_split(full, fraction=0.25, seed=3).task.queries == dev.task.queries
    reversed_full = build_mrpc_retrieval(write_mrpc(tmp_path / "rev", train=CHAIN_TRAIN[::-1]))
    assert set(dev_split(reversed_full, 0.25, seed=3).task.queries.values()) == set(dev.task.queries.values())
    splits = {frozenset(dev_split(full, 0.25, seed=s).task.queries.values()) for s in range(6)}
    assert len(splits) > 1
    # the chain: "alpha two ." is a paraphrase of both ends, so if it is an answer neither of its paraphrases'
    # paraphrases can be a query answered by a query
    for s in range(20):
        _check_dev_split(full, dev_split(full, fraction=0.5, seed=s))


@pytest.mark.parametrize("fraction", [0, 1, -0.1, 1.5, "0.2", True, 0.01])
def test_dev_split_rejects_bad_fractions(tmp_path, fraction):
    full = build_mrpc_retrieval(write_mrpc(tmp_path, train=CHAIN_TRAIN))
    with pytest.raises(ValueError, match="fraction|dev query"):
        dev_split(full, fraction=fraction)


@pytest.mark.integration
def test_dev_split_of_the_real_mrpc(shared_data):
    full = build_mrpc_retrieval(shared_data)
    dev = dev_split(full)
    _check_dev_split(full, dev)
    assert dev.stats == {"dev_queries": 522, "dev_corpus": 7134, "dev_relevant_docs": 541, "train_pairs_kept": 2036,
                         "train_pairs_excluded_dev_overlap": 576, "train_corpus": 6595}


# --------------------------------------------------------------------------- evaluator
def _hand_metrics(model, task) -> dict[str, float]:
    """nDCG@10, MRR@10, R@1 by hand: cosine of every query to every document, ranked, loops."""
    texts = list(dict.fromkeys([*task.queries.values(), *task.corpus.values()]))
    with torch.no_grad():
        emb = {t: e for t, e in zip(texts, model.encode(texts, convert_to_numpy=True), strict=True)}
    ndcg, mrr, r1 = [], [], []
    for qid, query in task.queries.items():
        q = emb[query].astype(np.float64)
        scored = []
        for did, doc in task.corpus.items():
            d = emb[doc].astype(np.float64)
            scored.append((float(q @ d / (np.linalg.norm(q) * np.linalg.norm(d))), did))
        ranking = [did for _, did in sorted(scored, key=lambda x: (-x[0], x[1]))]
        relevant = task.relevant_docs[qid]
        dcg = sum(1.0 / math.log2(rank + 2) for rank, did in enumerate(ranking[:10]) if did in relevant)
        ideal = sum(1.0 / math.log2(rank + 2) for rank in range(min(10, len(relevant))))
        ndcg.append(dcg / ideal)
        first = next((rank for rank, did in enumerate(ranking[:10]) if did in relevant), None)
        mrr.append(0.0 if first is None else 1.0 / (first + 1))
        r1.append(len(relevant & set(ranking[:1])) / len(relevant))
    return {"ndcg@10": 100 * np.mean(ndcg), "mrr@10": 100 * np.mean(mrr), "recall@1": 100 * np.mean(r1)}


def test_evaluate_retrieval_matches_hand_computed_metrics(tmp_path, text_model):
    from st_hardneg.evaluation import evaluate_retrieval

    root = write_mrpc(tmp_path)
    task = build_mrpc_retrieval(root).task
    result = evaluate_retrieval(text_model, root)
    expected = _hand_metrics(text_model, task)
    for key, value in expected.items():
        assert result[key] == pytest.approx(value, abs=1e-4), key
    assert result["queries"] == 4 and result["corpus"] == len(task.corpus)
    assert set(result) >= {"ndcg@10", "mrr@10", "recall@1", "recall@10", "accuracy@1", "map@100"}
    # the random tiny model is far from perfect: the test would catch a trivially perfect (leaky) task
    assert result["mrr@10"] < 100.0


def test_evaluator_is_an_st_ir_evaluator_and_restores_train_mode(tmp_path, text_model):
    from sentence_transformers.sentence_transformer.evaluation import InformationRetrievalEvaluator

    from st_hardneg.evaluation import mrpc_retrieval_evaluator

    evaluator = mrpc_retrieval_evaluator(write_mrpc(tmp_path))
    assert isinstance(evaluator, InformationRetrievalEvaluator)
    text_model.train()
    scores = evaluator(text_model)
    assert text_model.training and text_model.max_seq_length == 32
    name = "MRPC-paraphrase-retrieval_cosine_"
    assert {name + "ndcg@10", name + "mrr@10", name + "recall@1"} <= set(scores)
    assert evaluator.primary_metric == name + "ndcg@10"


def test_evaluator_rejects_inconsistent_tasks():
    from st_hardneg.evaluation.retrieval import LocalRetrievalEvaluator

    with pytest.raises(ValueError, match="not in the corpus"):
        LocalRetrievalEvaluator({"q": "a"}, {"d": "b"}, {"q": {"x"}})
    with pytest.raises(ValueError, match="queries and a corpus"):
        LocalRetrievalEvaluator({}, {"d": "b"}, {})
    with pytest.raises(ValueError, match="no query has a relevant"):
        LocalRetrievalEvaluator({"q": "a"}, {"d": "b"}, {"q": set()})


# --------------------------------------------------------------------------- mteb
def test_mteb_task_equals_the_st_evaluator(tmp_path, text_model):
    from st_hardneg.evaluation import evaluate_retrieval, run_mteb

    root = write_mrpc(tmp_path)
    reference = evaluate_retrieval(text_model, root)
    out = tmp_path / "mteb"
    result = run_mteb(text_model, ["MRPC-retrieval-local"], data_dir=root, output_dir=out, show_progress_bar=False)
    assert result["main_score"] == {"MRPC-retrieval-local": "ndcg_at_10"}
    assert abs(result["scores"]["MRPC-retrieval-local"] - reference["ndcg@10"]) < 1e-6
    files = list(out.rglob("MRPC-retrieval-local.json"))
    assert len(files) == 1
    test_scores = json.loads(files[0].read_text())["scores"]["test"][0]
    assert abs(100 * test_scores["mrr_at_10"] - reference["mrr@10"]) < 1e-6
    assert abs(100 * test_scores["recall_at_1"] - reference["recall@1"]) < 1e-6


@pytest.mark.integration
def test_real_mrpc_task_and_mteb_equality(shared_data, text_model):
    from st_hardneg.evaluation import evaluate_retrieval, run_mteb

    data = build_mrpc_retrieval(shared_data)
    stats = data.stats
    assert stats["test_paraphrase_pairs"] == 1147 and stats["train_paraphrase_pairs"] == 2753
    assert stats["queries"] + stats["queries_dropped_no_relevant_left"] == 1147
    assert stats["train_pairs_kept"] + stats["train_pairs_excluded_test_overlap"] <= 2753
    assert stats["train_sentences_excluded_test_overlap"] > 0  # the two files share sentences
    assert_no_test_leak(data, [s for pair in data.train_pairs for s in pair] + data.train_corpus)
    assert not set(data.task.queries.values()) & set(data.task.corpus.values())
    reference = evaluate_retrieval(text_model, shared_data)
    result = run_mteb(text_model, "MRPC-retrieval-local", data_dir=shared_data, show_progress_bar=False)
    assert abs(result["scores"]["MRPC-retrieval-local"] - reference["ndcg@10"]) < 1e-6


# --------------------------------------------------------------------------- mining
def test_mined_negatives_avoid_anchor_positive_known_paraphrases(tmp_path, text_model):
    data = build_mrpc_retrieval(write_mrpc(tmp_path))
    mined = mine_training_negatives(text_model, data.train_pairs, data.train_corpus,
                                    known_positives=data.known_paraphrases, relative_margin=None,
                                    forbidden=data.protected_sentences(), num_candidates=3)
    assert mined.column_names == ["anchor", "positive", "negative"]
    assert len(mined) == len(data.train_pairs)
    assert list(zip(mined["anchor"], mined["positive"], strict=True)) == data.train_pairs
    protected = data.protected_sentences()
    for row in mined:
        assert row["negative"] not in (row["anchor"], row["positive"])
        assert row["negative"] not in data.known_paraphrases.get(row["anchor"], set())
        assert row["negative"] in data.train_corpus and row["negative"] not in protected
    # with no margin, the negative is the most similar valid candidate (computed by hand)
    emb = dict(zip(data.train_corpus, text_model.encode(data.train_corpus), strict=True))
    anchor = data.train_pairs[0][0]
    cosine = {t: float(emb[anchor] @ e / np.linalg.norm(emb[anchor]) / np.linalg.norm(e)) for t, e in emb.items()}
    banned = {anchor, data.train_pairs[0][1], *data.known_paraphrases.get(anchor, ())}
    best = max((t for t in cosine if t not in banned), key=cosine.get)
    assert mined[0]["negative"] == best


def test_mining_refuses_test_sentences_and_bad_arguments(tmp_path, text_model):
    data = build_mrpc_retrieval(write_mrpc(tmp_path))
    leaky_corpus = [*data.train_corpus, "the cat is eating food ."]
    with pytest.raises(ValueError, match="forbidden sentence"):
        mine_training_negatives(text_model, data.train_pairs, leaky_corpus, forbidden=data.protected_sentences())
    with pytest.raises(ValueError, match="num_candidates"):
        mine_training_negatives(text_model, data.train_pairs, data.train_corpus, num_candidates=0)
    with pytest.raises(ValueError, match="no \\(anchor, positive\\) pair"):
        mine_training_negatives(text_model, [], data.train_corpus)


# --------------------------------------------------------------------------- benchmark smoke
@pytest.mark.integration
@pytest.mark.integration
@pytest.mark.parametrize("kwargs, match", [({"limit": -1}, "limit"), ({"limit": 2.5}, "limit"),
                                           ({"min_rows": 0}, "min_rows"), ({"min_rows": True}, "min_rows")])
def test_recipe_counts_are_checked_before_mining_or_reading(tmp_path, kwargs, match):
    from st_hardneg.training.protocol import mined_triplets, read_training_file

    data = build_mrpc_retrieval(write_mrpc(tmp_path))

    def never():
        raise AssertionError("the model must not be loaded")

    with pytest.raises(ValueError, match=match):
        mined_triplets(data, never, model_key="m", data_key="d", cache_dir=tmp_path / "cache", **kwargs)
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"anchor": "a", "positive": "b"}\n')
    with pytest.raises(ValueError, match=match):
        read_training_file(rows, **kwargs)
    assert not (tmp_path / "cache").exists()


def test_mean_std_text_is_the_sample_std_cell():
    from st_hardneg.reporting import mean_std_text

    assert mean_std_text([]) == "–" and mean_std_text([65.794]) == "65.79"
    # mean 66, sample std sqrt(((-1)^2 + 0 + 1^2) / 2) = 1
    assert mean_std_text([65.0, 66.0, 67.0]) == "66.00 ± 1.00"


def test_cached_dataset_builds_once_per_key(tmp_path):
    import hashlib

    from datasets import Dataset

    from st_hardneg.data.mining import cached_dataset, file_digest

    calls = []

    def build():
        calls.append(1)
        return Dataset.from_dict({"anchor": ["a", "b"], "positive": ["c", "d"], "negative": ["e", "f"]})

    key = {"model": "m", "limit": 2}
    first, path, _ = cached_dataset(tmp_path / "c", "mined", key, build)
    expected = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    assert path == tmp_path / "c" / f"mined-{expected}.json"
    again, again_path, _ = cached_dataset(tmp_path / "c", "mined", dict(reversed(key.items())), build)
    assert len(calls) == 1 and again_path == path and again.to_dict() == first.to_dict()
    cached_dataset(tmp_path / "c", "mined", {**key, "limit": 3}, build)  # another key: built again
    assert len(calls) == 2
    (tmp_path / "x").write_bytes(b"abc")
    assert file_digest([tmp_path / "x"]) == hashlib.sha256(b"abc").hexdigest()[:12]
