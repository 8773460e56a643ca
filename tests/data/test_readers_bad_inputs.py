"""Bad inputs to the data readers, the evaluations and the training helpers, and a loss built on
another model than the Trainer's (part 2): each case asserts the error (type and the words that name the problem),
the warning, or the exact value computed independently here."""

from __future__ import annotations

import json
import logging
import math
import re
import warnings
import zlib
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from st_hardneg.data import DataFormatError, check_texts, pair_dataset, read_sts_pairs
from st_hardneg.data.mining import cached_dataset, mine_training_negatives
from st_hardneg.data.mrpc import RetrievalTask, check_relevant_docs
from st_hardneg.evaluation import (
    COLLAPSE_TOLERANCE,
    INVALID_SCORE,
    DegenerateEmbeddingsError,
    SentEvalSTSEvaluator,
    alignment,
    alignment_uniformity,
    check_embeddings,
    evaluate_sts,
    relative_spread,
    uniformity,
)

STSB_ROW = "main-captions\tMSRvid\t2012test\t{i:04d}\t{g}\t{a}\t{b}"
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()


def _sentence(i: int, j: int) -> str:
    return " ".join(WORDS[(i * 3 + j * 5 + k) % len(WORDS)] for k in range(4))


@pytest.fixture
def senteval(tmp_path) -> Path:
    """A small valid SentEval STS tree: STS12 (one subset file pair per name), STS-B dev/test and SICK."""
    from st_hardneg.data import STS_YEAR_SUBSETS

    root = tmp_path / "senteval"
    for year, subsets in STS_YEAR_SUBSETS.items():
        folder = root / "STS" / f"{year}-en-test"
        folder.mkdir(parents=True)
        for k, name in enumerate(subsets):
            (folder / f"STS.input.{name}.txt").write_text("".join(f"{_sentence(k + i, 1)}\t{_sentence(k + i, 2)}\n"
                                                                  for i in range(3)))
            (folder / f"STS.gs.{name}.txt").write_text("".join(f"{(i + 1) * 1.1:.1f}\n" for i in range(3)))
    stsb = root / "STS" / "STSBenchmark"
    stsb.mkdir(parents=True)
    for split in ("dev", "test"):
        rows = [STSB_ROW.format(i=i, g=0.5 + i, a=_sentence(i, 3), b=_sentence(i, 4)) for i in range(4)]
        (stsb / f"sts-{split}.csv").write_text("\n".join(rows) + "\n")
    (root / "SICK").mkdir()
    sick = ["pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment"]
    sick += [f"{i}\t{_sentence(i, 5)}\t{_sentence(i, 6)}\t{1 + i * 0.7:.1f}\tNEUTRAL" for i in range(4)]
    (root / "SICK" / "SICK_test_annotated.txt").write_text("\n".join(sick) + "\n")
    return root


def _stsb(root: Path, split: str = "test") -> Path:
    return root / "STS" / "STSBenchmark" / f"sts-{split}.csv"


def _edit_line(path: Path, index: int, edit) -> None:
    lines = path.read_text().splitlines()
    lines[index] = edit(lines[index])
    path.write_text("\n".join(lines) + "\n")


# =========================================================================================== texts: lists of strings
@pytest.mark.parametrize(("texts", "error", "message"), [
    ("abc", TypeError, r"sentences must be a list of strings, got a str \('abc'\); a single text would be read as its "
                       r"characters: pass \['abc'\]"),
    (b"abc", TypeError, r"sentences must be a list of strings, got a bytes"),
    (42, TypeError, r"sentences must be a list of strings, got int"),
    (None, TypeError, r"sentences must be a list of strings, got NoneType"),
    ({"a": "b"}, TypeError, r"sentences must be a list of strings, got dict"),
    (["one", None, "three"], TypeError, r"sentences\[1\] is None \(NoneType\); every text must be a non-empty string"),
    (["one", "two", 3], TypeError, r"sentences\[2\] is 3 \(int\)"),
    (["one", 2.5], TypeError, r"sentences\[1\] is 2\.5 \(float\)"),
    (["one", ["nested"]], TypeError, r"sentences\[1\] is \['nested'\] \(list\)"),
    (["one", b"bytes"], TypeError, r"sentences\[1\] is b'bytes' \(bytes\)"),
    (["one", ""], ValueError, r"sentences\[1\] is an empty string \(''\)"),
    (["   ", "two"], ValueError, r"sentences\[0\] is an empty string \('   '\)"),
    (["one", "\t\n"], ValueError, r"sentences\[1\] is an empty string"),
    ([], ValueError, r"no sentences to train on"),
])
def test_pair_dataset_accepts_lists_of_non_empty_strings_only(texts, error, message):
    with pytest.raises(error, match=message):
        pair_dataset(texts)


@pytest.mark.parametrize("texts", [["a cat", "a dog"], ("a cat", "a dog"), iter(["a cat", "a dog"])],
                         ids=["list", "tuple", "iterator"])
def test_pair_dataset_keeps_every_valid_text_exactly(texts):
    data = pair_dataset(texts)
    assert data["anchor"] == ["a cat", "a dog"] and data["positive"] == ["a cat", "a dog"]


def test_pair_dataset_checks_a_dataset_column_by_name_and_index():
    from datasets import Dataset

    with pytest.raises(TypeError, match=r"sentences\['text'\]\[1\] is None"):
        pair_dataset(Dataset.from_dict({"text": ["one", None, "three"]}))
    assert pair_dataset(Dataset.from_dict({"text": ["one", "two"]}))["positive"] == ["one", "two"]


def test_check_texts_names_the_argument_it_is_given():
    with pytest.raises(TypeError, match=r"corpus\[0\] is 7 \(int\)"):
        check_texts([7], "corpus")
    assert check_texts((), "corpus", allow_empty_list=True) == []
    with pytest.raises(ValueError, match="corpus is empty: no text"):
        check_texts([], "corpus")


class _NoModel:
    """Stands for the mining model: the inputs must be refused before it is used."""

    def __getattr__(self, name):
        raise AssertionError(f"the model must not be used (asked for {name})")


@pytest.mark.parametrize(("pairs", "corpus", "error", "message"), [
    ("ab", ["x y", "y z"], TypeError, r"pairs must be a list of \(anchor, positive\) pairs of strings, got a str"),
    ([("a cat", None)], ["x y", "y z"], TypeError, r"the positives of pairs\[0\] is None"),
    ([("a cat", "a dog"), (3, "a dog")], ["x y", "y z"], TypeError, r"the anchors of pairs\[1\] is 3 \(int\)"),
    ([("a cat",)], ["x y", "y z"], TypeError, r"pairs\[0\] must be an \(anchor, positive\) pair of strings"),
    (["ab"], ["x y", "y z"], TypeError, r"pairs\[0\] must be an \(anchor, positive\) pair"),
    ([("a cat", "")], ["x y", "y z"], ValueError, r"the positives of pairs\[0\] is an empty string"),
    ([("a cat", "a dog")], ["x y", None], TypeError, r"corpus\[1\] is None"),
    ([("a cat", "a dog")], "corpus text", TypeError, r"corpus must be a list of strings, got a str"),
])
def test_mining_refuses_non_texts_before_the_model_runs(pairs, corpus, error, message):
    with pytest.raises(error, match=message):
        mine_training_negatives(_NoModel(), pairs, corpus)


# =========================================================================================== STS files
def test_stsb_line_with_an_eighth_field_is_an_error(senteval):
    _edit_line(_stsb(senteval), 1, lambda line: line + "\tstray")
    with pytest.raises(DataFormatError, match=r"sts-test\.csv, line 2: 8 tab-separated fields, expected 7 or 9 "
                                              r"\(genre, file, year, id, score, sentence 1, sentence 2\)"):
        read_sts_pairs(senteval, "STSBenchmark")


def test_stsb_line_with_ten_fields_is_an_error(senteval):
    _edit_line(_stsb(senteval), 3, lambda line: line + "\ta\tb\tc")
    with pytest.raises(DataFormatError, match=r"sts-test\.csv, line 4: 10 tab-separated fields, expected 7 or 9"):
        read_sts_pairs(senteval, "STSBenchmark")


def test_stsb_lines_with_the_two_source_fields_are_read_exactly(senteval):
    """The original STS-B files carry two source fields on some lines (nine fields): score in field 5, sentences in
    6 and 7, the sources ignored."""
    _edit_line(_stsb(senteval), 2, lambda line: line + "\tsource one\tsource two")
    s1, s2, gold = read_sts_pairs(senteval, "STSBenchmark")
    assert gold == [0.5, 1.5, 2.5, 3.5] and s1[2] == _sentence(2, 3) and s2[2] == _sentence(2, 4)


def test_sts_year_input_line_with_a_third_field_is_an_error(senteval):
    path = senteval / "STS" / "STS14-en-test" / "STS.input.images.txt"
    _edit_line(path, 1, lambda line: line + "\tthird")
    with pytest.raises(DataFormatError, match=r"STS\.input\.images\.txt, line 2: 3 tab-separated fields, expected 2 "
                                              r"\(sentence 1, sentence 2\)"):
        read_sts_pairs(senteval, "STS14")


def test_sts_year_gold_line_with_a_second_field_is_an_error(senteval):
    path = senteval / "STS" / "STS15-en-test" / "STS.gs.images.txt"
    path.write_text("1.1\n2.2\t4.0\n3.3\n")
    with pytest.raises(DataFormatError, match=r"STS\.gs\.images\.txt, line 2: 2 tab-separated fields, expected 1 "
                                              r"\(gold score\)"):
        read_sts_pairs(senteval, "STS15")


def test_sick_line_with_a_sixth_field_is_an_error(senteval):
    path = senteval / "SICK" / "SICK_test_annotated.txt"
    _edit_line(path, 3, lambda line: line + "\textra")
    with pytest.raises(DataFormatError, match=r"SICK_test_annotated\.txt, line 4: 6 tab-separated fields, expected 4 "
                                              r"or 5"):
        read_sts_pairs(senteval, "SICKRelatedness")


@pytest.mark.parametrize(("task", "where", "raw", "scale"), [
    ("STSBenchmark", "stsb", "5.5", r"\[0, 5\]"),
    ("STSBenchmark", "stsb", "-0.1", r"\[0, 5\]"),
    ("STSBenchmark-dev", "stsb-dev", "50", r"\[0, 5\]"),
    ("STS12", "gold", "5.01", r"\[0, 5\]"),
    ("STS12", "gold", "-1", r"\[0, 5\]"),
    ("SICKRelatedness", "sick", "0.5", r"\[1, 5\]"),
    ("SICKRelatedness", "sick", "6", r"\[1, 5\]"),
])
def test_gold_scores_outside_the_scale_name_file_and_line(senteval, task, where, raw, scale):
    if where.startswith("stsb"):
        path = _stsb(senteval, "dev" if where == "stsb-dev" else "test")
        path.write_text(path.read_text().replace("\t1.5\t", f"\t{raw}\t"))
        line = 2
    elif where == "gold":
        path = senteval / "STS" / "STS12-en-test" / "STS.gs.MSRvid.txt"
        path.write_text(f"1.1\n2.2\n{raw}\n")
        line = 3
    else:
        path = senteval / "SICK" / "SICK_test_annotated.txt"
        path.write_text(path.read_text().replace("\t1.7\t", f"\t{raw}\t"))
        line = 3
    with pytest.raises(DataFormatError, match=rf"{path.name}, line {line}: the gold score '{raw}' is outside the "
                                              rf"task's scale {scale}"):
        read_sts_pairs(senteval, task)


@pytest.mark.parametrize(("raw", "kind"), [("nan", "not finite"), ("inf", "not finite"), ("-inf", "not finite"),
                                           ("NaN", "not finite"), ("3,5", "not a number")])
def test_non_finite_gold_scores_in_year_files_name_file_and_line(senteval, raw, kind):
    path = senteval / "STS" / "STS16-en-test" / "STS.gs.headlines.txt"
    path.write_text(f"1.1\n{raw}\n3.3\n")
    with pytest.raises(DataFormatError, match=rf"STS\.gs\.headlines\.txt, line 2: the gold score '{raw}' is {kind}"):
        read_sts_pairs(senteval, "STS16")


def test_sick_nan_score_names_file_and_line(senteval):
    path = senteval / "SICK" / "SICK_test_annotated.txt"
    path.write_text(path.read_text().replace("\t2.4\t", "\tnan\t"))
    with pytest.raises(DataFormatError, match=r"SICK_test_annotated\.txt, line 4: the gold score 'nan' is not finite"):
        read_sts_pairs(senteval, "SICKRelatedness")


def test_scores_on_the_scale_edges_are_read_exactly(senteval):
    path = _stsb(senteval)
    path.write_text(path.read_text().replace("\t0.5\t", "\t0\t").replace("\t3.5\t", "\t5.000\t"))
    assert read_sts_pairs(senteval, "STSBenchmark")[2] == [0.0, 1.5, 2.5, 5.0]
    sick = senteval / "SICK" / "SICK_test_annotated.txt"
    sick.write_text(sick.read_text().replace("\t3.1\t", "\t5\t"))
    assert read_sts_pairs(senteval, "SICKRelatedness")[2] == [1.0, 1.7, 2.4, 5.0]


def test_the_real_senteval_files_pass_every_check(shared_data):
    """SentEval's own files (STS-B lines with source fields included) read with the published pair counts."""
    root = shared_data / "senteval"
    counts = {task: len(read_sts_pairs(root, task)[2]) for task in
              ("STS12", "STS13", "STS14", "STS15", "STS16", "STSBenchmark", "SICKRelatedness")}
    assert counts == {"STS12": 3108, "STS13": 1500, "STS14": 3750, "STS15": 3000, "STS16": 1186,
                      "STSBenchmark": 1379, "SICKRelatedness": 4927}


# =========================================================================================== collapse tolerance
def _spread_rows(spread: float, n: int = 40, d: int = 8, seed: int = 0) -> np.ndarray:
    """``n`` rows around one point whose largest distance from their mean is ``spread`` times their mean norm."""
    rng = np.random.default_rng(seed)
    center = rng.standard_normal(d) * 3.0
    noise = rng.standard_normal((n, d))
    noise -= noise.mean(axis=0)  # the rows' mean is the center
    largest = np.linalg.norm(noise, axis=1).max()
    rows = center + noise * (spread * np.linalg.norm(center) / largest)
    # the mean norm of the rows differs from ||center|| by O(spread²): one correction makes it exact
    return center + (rows - center) * (spread / relative_spread(rows))


def test_relative_spread_is_the_documented_quantity():
    x = np.array([[3.0, 4.0], [3.0, 4.0], [6.0, 8.0]])
    mean = x.mean(axis=0)
    expected = max(np.linalg.norm(r - mean) for r in x) / np.mean([5.0, 5.0, 10.0])
    assert relative_spread(x) == pytest.approx(expected, rel=1e-12)
    assert relative_spread(np.ones((3, 2))) == 0.0 and relative_spread(np.zeros((2, 3))) == math.inf
    assert COLLAPSE_TOLERANCE == 1e-4


@pytest.mark.parametrize("spread", [6e-6, 1e-7, 9e-5])
def test_a_nearly_collapsed_model_is_refused(spread):
    rows = _spread_rows(spread)
    assert relative_spread(rows) == pytest.approx(spread, rel=1e-3)
    assert not np.all(rows == rows[0])  # not identical: exact equality would have let them through
    with pytest.raises(DegenerateEmbeddingsError, match=r"within a relative distance of .* of their mean \(below the "
                                                        r"collapse tolerance 0\.0001\)"):
        check_embeddings(rows)


@pytest.mark.parametrize("spread", [2e-4, 1e-2, 0.5])
def test_a_spread_above_the_tolerance_is_scored(spread):
    check_embeddings(_spread_rows(spread))  # no error


class SpreadModel:
    """An 'encoder' whose embeddings are one point plus ``spread`` (relative) of per-sentence noise.

    The noise is seeded by a CRC of the sentence, not by ``hash()``: Python salts string hashes per process, and with
    4 dev pairs one salt in 24 ranks them exactly backwards, a Spearman of -100 (the invalid score's value).
    """

    def __init__(self, spread: float, d: int = 6):
        self.spread, self.d = spread, d
        self.center = np.linspace(1.0, 2.0, d)
        self.max_seq_length = 32
        self.training = False
        self.model_card_data = SimpleNamespace(set_evaluation_metrics=lambda *args: None)

    def encode(self, sentences, batch_size=32, show_progress_bar=False, convert_to_numpy=True):
        rows = []
        for s in sentences:
            rng = np.random.default_rng(zlib.crc32(s.encode()))
            direction = rng.standard_normal(self.d)
            rows.append(self.center + self.spread * np.linalg.norm(self.center) * direction / np.linalg.norm(direction))
        return np.asarray(rows, dtype=np.float64)


def test_evaluate_sts_refuses_a_model_spread_by_6e_6(senteval):
    with pytest.raises(DegenerateEmbeddingsError, match="collapse tolerance"):
        evaluate_sts(SpreadModel(3e-6), senteval, tasks=["STSBenchmark"], show_progress_bar=False)


def test_dev_evaluator_scores_a_collapsed_model_invalid(senteval, caplog):
    evaluator = SentEvalSTSEvaluator(senteval, tasks=("STSBenchmark-dev",))
    with caplog.at_level(logging.WARNING, logger="st_hardneg.evaluation.sts"):
        metrics = evaluator(SpreadModel(3e-6), steps=3)
    assert metrics["sts-dev_spearman"] == INVALID_SCORE and metrics["sts-dev_invalid"] == 1.0
    assert "collapse tolerance" in caplog.text and "after 3 steps" in caplog.text


def test_dev_evaluator_scores_a_spread_model_normally(senteval):
    metrics = SentEvalSTSEvaluator(senteval, tasks=("STSBenchmark-dev",))(SpreadModel(0.3))
    assert "sts-dev_invalid" not in metrics and -100.0 <= metrics["sts-dev_spearman"] <= 100.0
    assert metrics["sts-dev_spearman"] != INVALID_SCORE


def test_alignment_and_uniformity_refuse_a_nearly_collapsed_model(senteval):
    rows = _spread_rows(6e-6, n=10)
    with pytest.raises(DegenerateEmbeddingsError, match="collapse tolerance"):
        alignment(rows[:5], rows[5:])
    with pytest.raises(DegenerateEmbeddingsError, match="collapse tolerance"):
        uniformity(rows)
    with pytest.raises(DegenerateEmbeddingsError, match="collapse tolerance"):
        alignment_uniformity(SpreadModel(3e-6), senteval, threshold=0.0)


def test_alignment_of_a_healthy_spread_matches_the_hand_value():
    x = np.array([[1.0, 0.0], [0.0, 2.0], [3.0, 3.0]])
    y = np.array([[1.0, 1.0], [0.0, 1.0], [-1.0, 1.0]])
    unit = lambda v: v / np.linalg.norm(v, axis=1, keepdims=True)  # noqa: E731
    expected = np.mean(np.sum((unit(x) - unit(y)) ** 2, axis=1))
    assert alignment(x, y) == pytest.approx(expected, rel=1e-12)


# =========================================================================================== caches
def _build_counter(values):
    from datasets import Dataset

    calls = []

    def build():
        calls.append(1)
        return Dataset.from_dict({"anchor": values, "positive": values})

    return build, calls


@pytest.mark.parametrize("damage", [b"{not json", b"", b"\xff\xfe\x00garbage", b'{"key": 1}', b'{"columns": [], '
                                    b'"seconds": 1}', b"[1, 2, 3]"],
                         ids=["truncated", "empty", "binary", "no-columns", "columns-a-list", "a-list"])
def test_a_damaged_mining_cache_is_named_and_rebuilt(tmp_path, caplog, damage):
    build, calls = _build_counter(["a", "b"])
    _, path, _ = cached_dataset(tmp_path, "mined", {"k": 1}, build)
    path.write_bytes(damage)
    with caplog.at_level(logging.WARNING, logger="st_hardneg.data.mining"), \
            pytest.warns(UserWarning, match=rf"unreadable cache file {re.escape(str(path))}.*building the dataset "
                                            "again"):
        dataset, again, _ = cached_dataset(tmp_path, "mined", {"k": 1}, build)
    assert again == path and len(calls) == 2 and dataset["anchor"] == ["a", "b"]
    assert str(path) in caplog.text
    assert json.loads(path.read_text())["columns"] == {"anchor": ["a", "b"], "positive": ["a", "b"]}  # replaced
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cached_dataset(tmp_path, "mined", {"k": 1}, build)[0]["positive"] == ["a", "b"]
    assert len(calls) == 2  # the rebuilt file is read, not rebuilt again


def test_a_valid_cache_is_read_without_building(tmp_path):
    build, calls = _build_counter(["x"])
    cached_dataset(tmp_path, "mined", {"k": 2}, build)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dataset, _, seconds = cached_dataset(tmp_path, "mined", {"k": 2}, build)
    assert len(calls) == 1 and dataset["anchor"] == ["x"] and seconds >= 0.0


# =========================================================================================== relevance ids
@pytest.mark.parametrize(("relevant", "message"), [
    ({"q1": "d12"}, r"relevant_docs\['q1'\] is the string 'd12', not a set of document ids: a string would be read "
                    r"as its characters; write \{'d12'\}"),
    ({"q1": {"d1"}, "q2": "d2"}, r"relevant_docs\['q2'\] is the string 'd2'"),
    ({"q1": b"d1"}, r"relevant_docs\['q1'\] is the string b'd1'"),
    ({"q1": {"d1": 1}}, r"relevant_docs\['q1'\] must be a set \(or list\) of document ids, got dict \(graded qrels"),
    ({"q1": 5}, r"relevant_docs\['q1'\] must be a set \(or list\) of document ids, got int"),
    ({"q1": ["d1", 3]}, r"relevant_docs\['q1'\] holds 3 \(int\); document ids are strings"),
    ([("q1", {"d1"})], r"relevant_docs must map query ids to sets of document ids, got list"),
])
def test_relevance_ids_given_as_a_string_are_refused(relevant, message):
    with pytest.raises(TypeError, match=message):
        RetrievalTask(name="t", queries={"q1": "a query", "q2": "b"}, corpus={"d1": "doc", "d12": "doc 12"},
                      relevant_docs=relevant)


@pytest.mark.parametrize(("relevant", "message"), [
    ({"q1": "d12"}, r"relevant_docs\['q1'\] is the string 'd12', not a set of document ids"),
    ({"q1": {"d1": 1}}, r"relevant_docs\['q1'\] must be a set \(or list\) of document ids, got dict \(graded qrels"),
])
def test_the_evaluator_refuses_relevance_ids_given_as_a_string(relevant, message):
    """The evaluator used directly (not through RetrievalTask) checks too: ``{"q1": "d12"}`` is not split into the
    ids "d", "1", "2" (two of which exist in this corpus)."""
    from st_hardneg.evaluation.retrieval import LocalRetrievalEvaluator

    with pytest.raises(TypeError, match=message):
        LocalRetrievalEvaluator({"q1": "a query"}, {"d": "x", "1": "y", "d12": "doc 12", "d1": "doc"}, relevant)


def test_the_evaluator_reads_lists_of_ids_as_sets():
    from st_hardneg.evaluation.retrieval import LocalRetrievalEvaluator

    evaluator = LocalRetrievalEvaluator({"q1": "a query"}, {"d1": "x", "d2": "y"}, {"q1": ["d2", "d2"]})
    assert evaluator.relevant_docs == {"q1": {"d2"}}


def test_relevance_ids_in_lists_become_sets_exactly():
    task = RetrievalTask(name="t", queries={"q1": "a"}, corpus={"d1": "x", "d2": "y"},
                         relevant_docs={"q1": ["d2", "d1", "d2"]})
    assert task.relevant_docs == {"q1": {"d1", "d2"}}
    assert check_relevant_docs({"q": ("d1",)}) == {"q": {"d1"}}


# =========================================================================================== training helpers
def _config(tmp_path, **kwargs):
    from st_hardneg.training import TrainConfig

    return TrainConfig(output_dir=str(tmp_path / "out"), batch_size=4, show_progress_bar=False,
                       save_checkpoints=False, **kwargs)


@pytest.mark.parametrize(("texts", "message"), [
    (["a cat eats.", "the dog runs.", "a man plays."], r"train_dataset has 3 row\(s\), fewer than one batch of 4, and "
                                                       r"the last partial batch is dropped"),
    (["a cat eats."], r"train_dataset has 1 row\(s\), fewer than one batch of 4"),
])
def test_train_with_fewer_rows_than_a_batch_is_an_error_before_the_trainer(tiny_model, tmp_path, texts, message):
    from st_hardneg import MixCSELoss
    from st_hardneg.training import train

    with pytest.raises(ValueError, match=message):
        train(tiny_model, pair_dataset(texts), MixCSELoss(tiny_model), _config(tmp_path))
    assert not (tmp_path / "out").exists()  # no Trainer was built, nothing written


def test_train_with_an_empty_dataset_is_an_error(tiny_model, tmp_path):
    from datasets import Dataset

    from st_hardneg import MixCSELoss
    from st_hardneg.training import train

    with pytest.raises(ValueError, match="train_dataset has no rows: the run would make 0 optimizer steps"):
        train(tiny_model, Dataset.from_dict({"anchor": [], "positive": []}), MixCSELoss(tiny_model), _config(tmp_path))


def test_train_that_makes_no_step_all_the_same_raises(tiny_model, tmp_path):
    """Four rows, batch 4, but only three distinct texts: NO_DUPLICATES cannot fill a batch and drops it."""
    from st_hardneg import MixCSELoss
    from st_hardneg.training import train

    texts = ["a man plays.", "a man plays.", "the dog runs.", "the cat eats."]
    with pytest.raises(RuntimeError, match=r"training made 0 optimizer steps on 4 rows \(batch size 4, "
                                           r"dataloader_drop_last=True\): the model is untrained"):
        train(tiny_model, pair_dataset(texts), MixCSELoss(tiny_model), _config(tmp_path))


def test_train_keeping_the_partial_batch_makes_exactly_one_step(tiny_model, tmp_path):
    from st_hardneg import MixCSELoss
    from st_hardneg.training import train

    texts = ["a man plays.", "the dog runs.", "the cat eats."]
    result = train(tiny_model, pair_dataset(texts), MixCSELoss(tiny_model), _config(tmp_path, drop_last=False))
    assert result.steps == 1


# =========================================================================================== the loss's model
def _two_models(tiny_model_dir):
    from st_hardneg.models import load_model

    return [load_model(tiny_model_dir, pooling="cls", max_seq_length=16, device="cpu") for _ in range(2)]


def _trainer(model, loss, tmp_path, tiny_sentences, callbacks=()):
    from datasets import Dataset
    from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments

    args = SentenceTransformerTrainingArguments(output_dir=str(tmp_path / "out"), max_steps=1,
                                                per_device_train_batch_size=8, learning_rate=1e-2, report_to=[],
                                                save_strategy="no", disable_tqdm=True, use_cpu=True)
    data = Dataset.from_dict({"anchor": tiny_sentences[:8], "positive": tiny_sentences[:8]})
    return SentenceTransformerTrainer(model=model, args=args, train_dataset=data, loss=loss, callbacks=list(callbacks))


@pytest.mark.parametrize("loss_name", ["MixCSELoss", "FocalInfoNCELoss", "HNCSELoss"])
def test_a_plain_trainer_of_another_model_warns_at_its_first_step(tiny_model_dir, tmp_path, tiny_sentences,
                                                                  loss_name):
    """SentenceTransformerTrainer(model=A, loss=Loss(B)): neither model trains; the loss warns when the Trainer
    re-points it (there is no earlier place that sees both models)."""
    import st_hardneg
    from st_hardneg.testing import parameter_snapshot, parameters_changed

    a, b = _two_models(tiny_model_dir)
    loss = getattr(st_hardneg, loss_name)(b)
    before_a, before_b = parameter_snapshot(a), parameter_snapshot(b)
    with pytest.warns(UserWarning, match=rf"{loss_name}: loss\.model was re-pointed to another model than the one the "
                                         r"loss was built on"):
        _trainer(a, loss, tmp_path, tiny_sentences).train()
    # the reason for the warning: nothing trained
    assert not parameters_changed(a, before_a) and not parameters_changed(b, before_b)


def test_the_callback_warns_before_the_first_step(tiny_model_dir, tmp_path, tiny_sentences):
    from st_hardneg import MixCSELoss
    from st_hardneg.training import LossModelCheck

    a, b = _two_models(tiny_model_dir)
    loss = MixCSELoss(b)
    check = LossModelCheck(loss)
    steps = []
    original = loss.forward
    loss.forward = lambda *args: steps.append(1) or original(*args)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _trainer(a, loss, tmp_path, tiny_sentences, callbacks=[check]).train()
    messages = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
    built_on = [m for m in messages if "was built on another model than the Trainer's model" in m]
    assert len(built_on) == 1 and built_on[0].startswith("MixCSELoss was built on another model")
    assert not any("re-pointed" in m for m in messages)  # named once, not again at the first step
    assert check.warned and steps == [1]


def test_train_helper_names_a_loss_of_another_model_before_any_work(tiny_model_dir, tmp_path, tiny_sentences):
    from st_hardneg import FocalInfoNCELoss
    from st_hardneg.training import train

    a, b = _two_models(tiny_model_dir)
    with pytest.warns(UserWarning, match="FocalInfoNCELoss was built on another model than the Trainer's model"):
        train(a, pair_dataset(tiny_sentences[:8]), FocalInfoNCELoss(b), _config(tmp_path, max_steps=1))


def test_the_right_model_or_a_wrapper_of_it_is_silent(tiny_model, tmp_path, tiny_sentences):
    from st_hardneg import MixCSELoss
    from st_hardneg.training import LossModelCheck, check_loss_model

    loss = MixCSELoss(tiny_model)

    class Wrapper(torch.nn.Module):  # what DDP / torch.compile look like: the same parameters
        def __init__(self, module):
            super().__init__()
            self.module = module

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert check_loss_model(loss, tiny_model) == [] and check_loss_model(loss, Wrapper(tiny_model)) == []
        loss.model = Wrapper(tiny_model)  # the Trainer re-points to a wrapper of the same model: no warning
        loss.model = tiny_model
        check = LossModelCheck(loss)
        _trainer(tiny_model, loss, tmp_path, tiny_sentences, callbacks=[check]).train()
    assert not [str(w.message) for w in caught if any(
        words in str(w.message) for words in ("re-pointed", "another model", "optimizer holds none"))]
    assert not check.warned


def test_wrapped_losses_and_dicts_are_searched_and_named(tiny_model_dir):
    from sentence_transformers.sentence_transformer.losses import MatryoshkaLoss, MultipleNegativesRankingLoss

    from st_hardneg import MixCSELoss
    from st_hardneg.training import check_loss_model

    a, b = _two_models(tiny_model_dir)
    with pytest.warns(UserWarning, match=r"MatryoshkaLoss, MixCSELoss \(loss\) was built on another model"):
        assert check_loss_model(MatryoshkaLoss(b, MixCSELoss(b), [32, 16]), a) == ["MatryoshkaLoss",
                                                                                    "MixCSELoss (loss)"]
    with pytest.warns(UserWarning, match=r"MultipleNegativesRankingLoss \(second\) was built on another model"):
        assert check_loss_model({"first": MixCSELoss(a), "second": MultipleNegativesRankingLoss(b)}, a) == [
            "MultipleNegativesRankingLoss (second)"]


def test_a_guide_model_is_not_taken_for_the_trained_model(tiny_model_dir):
    from sentence_transformers.sentence_transformer.losses import GISTEmbedLoss

    from st_hardneg import MixCSELoss
    from st_hardneg.training import check_loss_model

    a, guide = _two_models(tiny_model_dir)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert check_loss_model(GISTEmbedLoss(a, guide), a) == []
        assert check_loss_model(MixCSELoss(a, guide), a) == []
    assert not [w for w in caught if "another model" in str(w.message)]


def test_an_optimizer_without_the_models_parameters_is_named(tiny_model_dir):
    from st_hardneg import MixCSELoss
    from st_hardneg.training import LossModelCheck

    a, b = _two_models(tiny_model_dir)
    check = LossModelCheck(MixCSELoss(a))
    with pytest.warns(UserWarning, match=r"the optimizer holds none of the Trainer's model's \d+ trainable parameters"):
        check.on_train_begin(None, None, None, model=a, optimizer=torch.optim.SGD(b.parameters(), lr=0.1))
    fine = LossModelCheck(MixCSELoss(a))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fine.on_train_begin(None, None, None, model=a, optimizer=torch.optim.SGD(a.parameters(), lr=0.1))
    assert check.warned and not fine.warned


def test_adcse_of_another_model_is_named_once_then_refused(tiny_model_dir, tmp_path, tiny_sentences):
    """AdCSE keeps state of the model it was built for: the train helper names the mismatch once (not again in the
    StatefulLossCallback), and the first step refuses the re-pointed model."""
    from st_hardneg import AdversarialNegativesLoss
    from st_hardneg.training import train

    a, b = _two_models(tiny_model_dir)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(RuntimeError, match="another model than the one it was built for"):
            train(a, pair_dataset(tiny_sentences[:8]), AdversarialNegativesLoss(b, num_adversaries=2, seed=0),
                  _config(tmp_path, max_steps=1))
    named = [str(w.message) for w in caught if "built on another model" in str(w.message)
             or "re-pointed" in str(w.message)]
    assert len(named) == 1 and named[0].startswith("AdversarialNegativesLoss was built on another model")


def test_stateful_callback_names_a_loss_of_another_model(tiny_model_dir):
    from st_hardneg import AdversarialNegativesLoss
    from st_hardneg.training import StatefulLossCallback

    a, b = _two_models(tiny_model_dir)
    loss = AdversarialNegativesLoss(b, num_adversaries=2, seed=0)
    with pytest.warns(UserWarning, match="AdversarialNegativesLoss was built on another model than the Trainer's"):
        StatefulLossCallback(loss).on_train_begin(None, SimpleNamespace(global_step=0), None, model=a,
                                                  optimizer=torch.optim.SGD(b.parameters(), lr=0.1))


@pytest.mark.parametrize("content", ['{"runs": [1, 2', "[]", '{"protocol": {}}', "\udcff"],
                         ids=["truncated", "a-list", "no-runs", "not-utf8"])
def test_a_damaged_results_file_is_named_and_kept(tmp_path, content):
    """A benchmark's results file holds finished runs: unlike a cache it is never rebuilt over."""
    from st_hardneg.reporting import load_results

    path = tmp_path / "results.json"
    raw = content.encode("utf8", "surrogateescape")
    path.write_bytes(raw)
    with pytest.raises(ValueError, match=rf"the results file {re.escape(str(path))} (cannot be read|is not a results "
                                         r"file).*repair or move it"):
        load_results(path, {"p": 1})
    assert path.read_bytes() == raw  # untouched
