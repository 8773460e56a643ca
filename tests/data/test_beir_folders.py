"""BEIR folders: the reader's validation, the dev split, the evaluators (ST vs mteb vs an independent nDCG), the
embedding cache, mining at corpus scale and ``--task beir`` on the command line. All on a tiny folder written here."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import numpy as np
import pytest

from st_hardneg.data.beir import BEIRFormatError, beir_retrieval, load_beir
from st_hardneg.data.senteval import DataNotFoundError
from st_hardneg.testing.beir import make_tiny_beir


@pytest.fixture
def beir_dir(tmp_path) -> Path:
    return make_tiny_beir(tmp_path / "tiny")


@pytest.fixture(scope="module")
def beir_model(tmp_path_factory):
    """A tiny random BERT whose vocabulary holds every word of the tiny folder (no artificial ties)."""
    from st_hardneg.models import load_model
    from st_hardneg.testing import make_text_model_dir

    root = make_tiny_beir(tmp_path_factory.mktemp("vocab"))
    data = load_beir(root)
    texts = [t.replace(":", "").replace(".", "").replace(",", "") for t in [*data.queries.values(),
                                                                           *data.corpus.values()]]
    path = make_text_model_dir(tmp_path_factory.mktemp("beir-bert"), texts)
    return load_model(path, pooling="mean", max_seq_length=64, device="cpu")


def _rewrite(path: Path, transform) -> None:
    path.write_text(transform(path.read_text()))


# --------------------------------------------------------------------------- reading
def test_reader_joins_title_and_text_as_mteb_does(beir_dir):
    data = load_beir(beir_dir)
    rows = [json.loads(line) for line in (beir_dir / "corpus.jsonl").read_text().splitlines()]
    assert len(data.corpus) == len(rows) == 48 and data.splits == ("test", "train")
    for row in rows:
        expected = f"{row['title']} {row['text']}" if row["title"] else row["text"]
        assert data.corpus[row["_id"]] == expected and data.texts[row["_id"]] == row["text"]
    assert data.name == "tiny" and load_beir(beir_dir, name="other").name == "other"
    test = data.task("test")
    qrels = [line.split("\t") for line in (beir_dir / "qrels" / "test.tsv").read_text().splitlines()[1:]]
    assert test.relevant_docs == {q: {d for q2, d, _ in qrels if q2 == q} for q, _, _ in qrels}
    assert set(test.queries) == {q for q, _, _ in qrels} and test.corpus == data.corpus


def test_reader_reads_a_headerless_qrels_and_skips_blank_lines(tmp_path):
    root = make_tiny_beir(tmp_path / "nohead", header=False)
    _rewrite(root / "corpus.jsonl", lambda text: text + "\n\n")
    with_header = load_beir(make_tiny_beir(tmp_path / "head"))
    assert load_beir(root).qrels == with_header.qrels


def test_zero_scores_are_judged_but_not_relevant(beir_dir):
    _rewrite(beir_dir / "qrels" / "test.tsv", lambda text: text + "25\t1001\t0\n")
    data = load_beir(beir_dir)
    assert data.qrels["test"]["25"]["1001"] == 0 and "1001" not in data.relevant("test")["25"]


@pytest.mark.parametrize("remove, fragment", [
    ("corpus.jsonl", "corpus.jsonl"), ("queries.jsonl", "queries.jsonl"), ("qrels", "qrels"),
])
def test_missing_files_are_named(beir_dir, remove, fragment):
    import shutil

    target = beir_dir / remove
    shutil.rmtree(target) if target.is_dir() else target.unlink()
    with pytest.raises(DataNotFoundError, match=fragment):
        load_beir(beir_dir)


def test_missing_folder(tmp_path):
    with pytest.raises(DataNotFoundError, match="no BEIR folder"):
        load_beir(tmp_path / "absent")


CORRUPTIONS = [
    ("corpus.jsonl", lambda t: t + "{not json\n", r"corpus.jsonl, line 49: not a JSON object"),
    ("corpus.jsonl", lambda t: t + "[1, 2]\n", r"line 49: expected a JSON object"),
    ("corpus.jsonl", lambda t: t + '{"text": "x"}\n', r"line 49: a document needs the key\(s\) \['_id'\]"),
    ("corpus.jsonl", lambda t: t + '{"_id": "", "text": "x"}\n', "_id must be a non-empty string"),
    ("corpus.jsonl", lambda t: t + '{"_id": "1000", "text": "again"}\n', r"duplicate document id '1000' \(first on line 1"),
    ("corpus.jsonl", lambda t: t + '{"_id": "9", "title": 3, "text": "x"}\n', "title and text must be strings"),
    ("corpus.jsonl", lambda t: "", "no document in the file"),
    ("queries.jsonl", lambda t: t + '{"_id": "1", "text": "again"}\n', "duplicate query id '1'"),
    ("queries.jsonl", lambda t: t + '{"_id": "99", "text": "  "}\n', "empty query text"),
    ("qrels/test.tsv", lambda t: t + "404\t1000\t1\n", r"test.tsv, line 13: query id '404' is not in queries.jsonl"),
    ("qrels/test.tsv", lambda t: t + "25\t404\t1\n", "corpus id '404' is not in corpus.jsonl"),
    ("qrels/test.tsv", lambda t: t + "25\t1000\n", "expected 3 tab-separated fields"),
    ("qrels/test.tsv", lambda t: t + "25\t1000\tyes\n", "the score must be an integer, got 'yes'"),
    ("qrels/test.tsv", lambda t: t + t.splitlines()[1] + "\n", "is judged twice"),
    ("qrels/test.tsv", lambda t: t.splitlines()[0] + "\n", "no judgement in the file"),
]


@pytest.mark.parametrize("name, corrupt, message", CORRUPTIONS)
def test_malformed_files_are_named_with_their_line(beir_dir, name, corrupt, message):
    _rewrite(beir_dir / name, corrupt)
    with pytest.raises(BEIRFormatError, match=message):
        load_beir(beir_dir)


def test_unknown_or_empty_split(beir_dir):
    _rewrite(beir_dir / "qrels" / "test.tsv", lambda t: t.replace("\t1\n", "\t0\n"))
    data = load_beir(beir_dir)
    with pytest.raises(ValueError, match="no split 'dev'; its qrels files are: test, train"):
        data.task("dev")
    with pytest.raises(ValueError, match="no relevant judgement"):
        data.task("test")


def test_documents_without_text_are_kept_with_a_warning(beir_dir, caplog):
    _rewrite(beir_dir / "corpus.jsonl", lambda t: t + '{"_id": "empty", "title": "", "text": ""}\n')
    with caplog.at_level(logging.WARNING, logger="st_hardneg.data.beir"):
        data = load_beir(beir_dir)
    assert data.corpus["empty"] == "" and "1 document(s) have no title and no text" in caplog.text


# --------------------------------------------------------------------------- the dev split
def test_dev_split_is_disjoint_and_deterministic(beir_dir):
    data = load_beir(beir_dir)
    split = beir_retrieval(data, dev_fraction=0.25, seed=0)
    dev, test = split.dev_task, split.task
    assert dev is not None and len(dev.queries) == round(0.25 * len(data.relevant("train")))
    assert not set(dev.queries) & set(test.queries)
    trained = {anchor for anchor, _ in split.train_pairs}
    assert not trained & set(dev.queries.values()) and not trained & set(test.queries.values())
    assert dev.relevant_docs == {q: data.relevant("train")[q] for q in dev.queries}
    # every remaining training judgement is a pair, each relevant document is a known positive
    kept = {q for q in data.relevant("train") if q not in dev.queries}
    expected = {(data.queries[q], data.corpus[d]) for q in kept for d in data.relevant("train")[q]}
    assert set(split.train_pairs) == expected and len(split.train_pairs) == len(expected)
    for query in kept:
        assert split.known_paraphrases[data.queries[query]] == {data.corpus[d] for d in data.relevant("train")[query]}
    assert split.train_corpus == list(dict.fromkeys(data.corpus.values()))
    assert split.protected_sentences() == set(dev.queries.values()) | set(test.queries.values())
    again = beir_retrieval(data, dev_fraction=0.25, seed=0)
    assert again.dev_task.queries == dev.queries and again.train_pairs == split.train_pairs
    other = beir_retrieval(data, dev_fraction=0.25, seed=1)
    assert other.dev_task.queries != dev.queries
    assert split.dev().task is dev and split.dev().dev_task is test


def test_a_training_query_with_a_test_querys_text_is_dropped(beir_dir):
    data = load_beir(beir_dir)
    test_query = sorted(data.relevant("test"))[0]
    # make train query 1 read exactly like a test query
    lines = [json.loads(x) for x in (beir_dir / "queries.jsonl").read_text().splitlines()]
    for row in lines:
        if row["_id"] == "1":
            row["text"] = data.queries[test_query]
    (beir_dir / "queries.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    split = beir_retrieval(load_beir(beir_dir), dev_fraction=0.0)
    assert split.dev_task is None
    assert split.stats["train_queries_dropped_same_text_as_test"] == 1
    assert data.queries[test_query] not in {a for a, _ in split.train_pairs}


@pytest.mark.parametrize("kwargs, message", [
    ({"dev_fraction": 1.0}, r"dev_fraction must be a number in \[0, 1\)"),
    ({"dev_fraction": -0.1}, "dev_fraction must be"),
    ({"dev_fraction": True}, "dev_fraction must be"),
    ({"dev_fraction": 0.001}, "leaves no dev query"),
    ({"eval_split": "train"}, "training on the evaluated queries"),
    ({"eval_split": "dev"}, "no split 'dev'"),
])
def test_split_arguments_are_checked(beir_dir, kwargs, message):
    with pytest.raises(ValueError, match=message):
        beir_retrieval(beir_dir, **kwargs)


def test_no_dev_task_without_a_fraction(beir_dir):
    split = beir_retrieval(beir_dir, dev_fraction=0)
    with pytest.raises(ValueError, match="no dev task"):
        split.dev()


# --------------------------------------------------------------------------- evaluation
def _ndcg_at_10(scores: np.ndarray, relevant: set[int], ids: list[str]) -> float:
    """Binary nDCG@10 (every judgement has score 1), computed from the similarity matrix row; tied documents (the
    8-token cut makes some identical) ranked as trec_eval / mteb rank them: by document id, descending."""
    order = sorted(range(len(scores)), key=lambda i: (float(scores[i]), ids[i]), reverse=True)[:10]
    dcg = sum(1.0 / math.log2(rank + 2) for rank, doc in enumerate(order) if doc in relevant)
    ideal = sum(1.0 / math.log2(rank + 2) for rank in range(min(len(relevant), 10)))
    return dcg / ideal


def test_evaluate_beir_matches_an_independent_ndcg_and_the_fixed_length(beir_dir, beir_model):
    from st_hardneg.evaluation.retrieval import evaluate_beir

    data = load_beir(beir_dir)
    task = data.task("test")
    beir_model.max_seq_length = 64
    scores = evaluate_beir(beir_model, [task], max_seq_length=8)[task.name]
    assert beir_model.max_seq_length == 64  # restored
    beir_model.max_seq_length = 8
    ids = list(task.corpus)
    docs = beir_model.encode([task.corpus[d] for d in ids], normalize_embeddings=True)
    queries = beir_model.encode([task.queries[q] for q in task.queries], normalize_embeddings=True)
    beir_model.max_seq_length = 64
    expected = np.mean([_ndcg_at_10(docs @ q, {ids.index(d) for d in task.relevant_docs[qid]}, ids)
                        for q, qid in zip(queries, task.queries, strict=True)])
    assert scores["ndcg@10"] == pytest.approx(100 * expected, abs=1e-4)
    assert scores["queries"] == len(task.queries) and scores["corpus"] == 48
    at_64 = evaluate_beir(beir_model, [task], max_seq_length=64)[task.name]
    assert at_64["ndcg@10"] != scores["ndcg@10"]  # the length is used (8 tokens cut every document)


def test_dev_and_test_share_one_encoding(beir_dir, beir_model, monkeypatch):
    from st_hardneg.evaluation import retrieval

    split = beir_retrieval(beir_dir)
    calls = []
    real = retrieval.encode_at_length
    monkeypatch.setattr(retrieval, "encode_at_length", lambda *a, **k: calls.append(len(a[1])) or real(*a, **k))
    both = retrieval.evaluate_beir(beir_model, [split.dev_task, split.task])
    # one encoding of the queries (encode_query) and one of the corpus (encode_document), shared by both tasks
    assert calls == [len(set(split.dev_task.queries.values()) | set(split.task.queries.values())),
                     len(set(split.task.corpus.values()))]
    alone = retrieval.evaluate_beir(beir_model, [split.task])
    assert both[split.task.name] == alone[split.task.name]
    with pytest.raises(ValueError, match="distinct"):
        retrieval.evaluate_beir(beir_model, [split.task, split.task])


def test_embedding_cache_is_read_back_and_a_corrupt_file_is_rebuilt(beir_dir, beir_model, tmp_path, monkeypatch,
                                                                    caplog):
    from st_hardneg.evaluation import retrieval

    task = load_beir(beir_dir).task("test")
    first = retrieval.evaluate_beir(beir_model, [task], cache_dir=tmp_path / "cache")
    files = sorted((tmp_path / "cache").glob("*.npy"), key=lambda f: f.stat().st_size)
    assert len(files) == 2 and not list((tmp_path / "cache").glob("*.tmp*"))  # the queries' and the documents'
    files = files[::-1]  # the corpus's (the larger) first

    def refuse(*args, **kwargs):
        raise AssertionError("encoded although cached")

    monkeypatch.setattr(retrieval, "encode_at_length", refuse)
    assert retrieval.evaluate_beir(beir_model, [task], cache_dir=tmp_path / "cache") == first
    monkeypatch.undo()
    files[0].write_bytes(b"garbage")
    with caplog.at_level(logging.WARNING, logger="st_hardneg.evaluation.retrieval"):
        assert retrieval.evaluate_beir(beir_model, [task], cache_dir=tmp_path / "cache") == first
    assert "unreadable embedding cache" in caplog.text and str(files[0]) in caplog.text


def test_mteb_path_agrees_with_the_sentence_transformers_evaluator(beir_dir, beir_model):
    pytest.importorskip("mteb")
    from st_hardneg.evaluation.mteb_run import run_mteb
    from st_hardneg.evaluation.mteb_tasks import beir_mteb_task
    from st_hardneg.evaluation.retrieval import evaluate_beir

    data = load_beir(beir_dir)
    ours = evaluate_beir(beir_model, [data.task("test")], max_seq_length=16)[data.task("test").name]
    result = run_mteb(beir_model, [beir_mteb_task(data, "test", max_seq_length=16)], model_name="tiny",
                      show_progress_bar=False)
    assert result["scores"]["tiny-test-local"] == pytest.approx(ours["ndcg@10"], abs=1e-4)
    assert result["main_score"]["tiny-test-local"] == "ndcg_at_10"


# --------------------------------------------------------------------------- mining and the command line
def test_mined_negatives_are_never_relevant_nor_evaluated(beir_dir, beir_model, tmp_path, monkeypatch):
    from st_hardneg.training import protocol as recipe

    data = load_beir(beir_dir)
    split = beir_retrieval(data)
    monkeypatch.setattr("st_hardneg.models.resolve_model", lambda *a, **k: beir_model)
    dataset, info = recipe.mined_beir_triplets(data, split, mining={"relative_margin": None},
                                               cache_dir=tmp_path / "mined")
    assert len(dataset) > 0 and info["pairs"] == len(split.train_pairs)
    protected = split.protected_sentences()
    for anchor, positive, negative in zip(dataset["anchor"], dataset["positive"], dataset["negative"], strict=True):
        assert (anchor, positive) in split.train_pairs
        assert negative not in split.known_paraphrases[anchor] and negative in split.train_corpus
        assert anchor not in protected
    # cached: the second call mines nothing
    monkeypatch.setattr("st_hardneg.models.resolve_model", lambda *a, **k: pytest.fail("mined again"))
    again, info2 = recipe.mined_beir_triplets(data, split, mining={"relative_margin": None},
                                              cache_dir=tmp_path / "mined")
    assert again.to_dict() == dataset.to_dict() and info2["cache_file"] == info["cache_file"]


@pytest.mark.parametrize("argv, message", [
    (["train", "--task", "beir"], "--task beir needs --data PATH"),
    (["train", "--task", "sts", "--data", "x"], "--data applies to --task beir only"),
    (["eval", "--task", "beir"], "--task beir needs --data PATH"),
    (["eval", "--tasks", "sts", "--data", "x"], "--data is the BEIR folder of --task beir"),
    (["eval", "--task", "beir", "--data", "/nonexistent/beir"], "no BEIR folder"),
])
def test_cli_refuses_before_loading_a_model(argv, message, capsys, monkeypatch):
    from st_hardneg.cli import app

    monkeypatch.setattr("st_hardneg.models.resolve_model", lambda *a, **k: pytest.fail("model loaded"))
    assert app.main(argv) == 2
    assert message in capsys.readouterr().err


def test_cli_eval_beir_prints_and_writes_the_scores(beir_dir, beir_model, tmp_path, capsys, monkeypatch):
    from st_hardneg.cli import app, evaluate
    from st_hardneg.evaluation.retrieval import evaluate_beir

    monkeypatch.setattr(evaluate, "load_for_eval", lambda name, pooling: beir_model)
    out = tmp_path / "scores.json"
    assert app.main(["eval", "--task", "beir", "--data", str(beir_dir), "--split", "test", "--max-seq-length", "16",
                     "--output", str(out), "--quiet"]) == 0
    written = json.loads(out.read_text())["beir"]["tiny-test"]
    expected = evaluate_beir(beir_model, [load_beir(beir_dir).task("test")], max_seq_length=16)["tiny-test"]
    assert written["ndcg@10"] == pytest.approx(expected["ndcg@10"]) and written["split"] == "test"
    assert f"{expected['ndcg@10']:.2f}" in capsys.readouterr().out


def test_per_query_ndcg_averages_to_the_evaluators_score(beir_dir, beir_model):
    from st_hardneg.evaluation.retrieval import evaluate_beir, per_query_ndcg

    task = load_beir(beir_dir).task("test")
    per_query = per_query_ndcg(beir_model, task, max_seq_length=16)
    assert set(per_query) == set(task.queries)
    assert np.mean(list(per_query.values())) == pytest.approx(
        evaluate_beir(beir_model, [task], max_seq_length=16)[task.name]["ndcg@10"], abs=1e-4)
    assert all(0.0 <= v <= 100.0 for v in per_query.values()) and len(set(per_query.values())) > 1


def test_cli_train_beir_end_to_end(beir_dir, tiny_model_dir, tmp_path, capsys):
    from st_hardneg.cli import app

    out = tmp_path / "out"
    argv = ["train", "--task", "beir", "--data", str(beir_dir), "--model", str(tiny_model_dir), "--max-steps", "1",
            "--batch-size", "4", "--mining-arg", "relative_margin=None", "--cache-dir", str(tmp_path / "cache"),
            "--output-dir", str(out), "--quiet"]
    assert app.main(argv) == 0
    results = json.loads((out / "results.json").read_text())
    split = beir_retrieval(beir_dir)
    assert results["task"] == "beir" and results["steps"] == 1 and results["split"] == split.stats
    assert results["test"]["queries"] == len(split.task.queries) and results["dev"]["corpus"] == 48
    assert results["training_data"]["pairs"] == len(split.train_pairs)
    assert (out / "final" / "modules.json").is_file()
    printed = capsys.readouterr().out
    assert f"| mixcse | {results['test']['ndcg@10']:.2f} |" in printed
    assert app.main(argv) == 2  # a finished run is not overwritten
    assert "holds a finished run" in capsys.readouterr().err


def test_float_ids_are_refused_as_numbers_and_kept_as_written_as_strings(tmp_path):
    import json

    from st_hardneg.data.beir import BEIRFormatError, load_beir
    from st_hardneg.evaluation.retrieval import task_qrels
    from st_hardneg.testing.beir import make_tiny_beir

    root = make_tiny_beir(tmp_path / "tiny")
    corpus = root / "corpus.jsonl"
    original = corpus.read_text()
    corpus.write_text(original + '{"_id": 7.9, "text": "a float id"}\n')
    with pytest.raises(BEIRFormatError, match=r"_id must be a non-empty string, got 7\.9"):  # never int(7.9) = 7
        load_beir(root)
    rows = [json.loads(line) for line in original.splitlines()]
    corpus.write_text("".join(json.dumps({**row, "_id": f"{row['_id']}.50"}) + "\n" for row in rows))
    qrels = root / "qrels" / "test.tsv"
    lines = qrels.read_text().splitlines()
    qrels.write_text("\n".join([lines[0], *(f"{q}\t{d}.50\t{s}" for q, d, s in
                                            (line.split("\t") for line in lines[1:]))]) + "\n")
    (root / "qrels" / "train.tsv").unlink()
    data = load_beir(root)
    judged = {doc for docs in task_qrels(data.task("test")).values() for doc in docs}
    assert judged and all(doc.endswith(".50") for doc in judged) and judged <= set(data.corpus)
