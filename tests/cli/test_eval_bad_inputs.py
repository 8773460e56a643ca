"""Bad inputs to the evaluation and the command line: each gets one clear error naming what is wrong and where,
or the exact correct result; nothing is scored silently on damaged data or degenerate embeddings."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from st_hardneg import cli
from st_hardneg.data import STS_YEAR_SUBSETS, DataFormatError, read_corpus, read_sts_pairs
from st_hardneg.evaluation import (
    INVALID_SCORE,
    DegenerateEmbeddingsError,
    SentEvalSTSEvaluator,
    alignment,
    alignment_uniformity,
    check_embeddings,
    cosine_spearman,
    evaluate_sts,
    uniformity,
)
from st_hardneg.training import TrainConfig
from st_hardneg.training.experiment import planned_steps

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
STSB_ROW = "main-captions\tMSRvid\t2012test\t{i:04d}\t{g}\t{a}\t{b}"


def _sentence(i: int, j: int) -> str:
    return " ".join(WORDS[(i * 3 + j * 5 + k) % len(WORDS)] for k in range(4))


@pytest.fixture
def senteval(tmp_path) -> Path:
    """A complete, valid SentEval STS tree with a few pairs per file (every score distinct)."""
    root = tmp_path / "senteval"
    n = 0
    for year, subsets in STS_YEAR_SUBSETS.items():
        folder = root / "STS" / f"{year}-en-test"
        folder.mkdir(parents=True)
        for name in subsets:
            pairs = [(_sentence(n + k, 1), _sentence(n + k, 2)) for k in range(3)]
            n += 3
            (folder / f"STS.input.{name}.txt").write_text("".join(f"{a}\t{b}\n" for a, b in pairs))
            (folder / f"STS.gs.{name}.txt").write_text("".join(f"{(k + 1) * 1.1:.1f}\n" for k in range(3)))
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


class ConstantModel:
    """An 'encoder' returning ``fill(sentence)`` for every sentence (NaN, zero, constant, or per-sentence vectors)."""

    def __init__(self, fill):
        self.fill = fill
        self.max_seq_length = 32
        self.training = False
        self.model_card_data = SimpleNamespace(set_evaluation_metrics=lambda *args: None)

    def encode(self, sentences, batch_size=32, show_progress_bar=False, convert_to_numpy=True):
        return np.stack([np.asarray(self.fill(s), dtype=np.float32) for s in sentences])


def _stsb(root: Path) -> Path:
    return root / "STS" / "STSBenchmark" / "sts-test.csv"


# --------------------------------------------------------------------------- damaged STS files
def _edit_line(path, index: int, edit) -> None:
    """Replace line ``index`` (0-based) of a text file by ``edit(line)``."""
    lines = path.read_text().splitlines()
    lines[index] = edit(lines[index])
    path.write_text("\n".join(lines) + "\n")


def test_valid_tree_reads_every_pair_exactly(senteval):
    s1, s2, gold = read_sts_pairs(senteval, "STSBenchmark")
    assert gold == [0.5, 1.5, 2.5, 3.5] and s1[0] == _sentence(0, 3) and s2[3] == _sentence(3, 4)
    assert len(read_sts_pairs(senteval, "STS14")[2]) == 3 * len(STS_YEAR_SUBSETS["STS14"])
    assert read_sts_pairs(senteval, "SICKRelatedness")[2] == [1.0, 1.7, 2.4, 3.1]


def test_truncated_stsb_line_names_file_and_line(senteval):
    path = _stsb(senteval)
    _edit_line(path, 2, lambda line: "\t".join(line.split("\t")[:6]))  # the second sentence is cut off
    with pytest.raises(DataFormatError, match=r"sts-test\.csv, line 3: 6 tab-separated field\(s\), expected at least 7"):
        read_sts_pairs(senteval, "STSBenchmark")


def test_truncated_stsb_file_is_not_scored_silently(senteval):
    path = _stsb(senteval)
    text = path.read_text().rstrip("\n")
    path.write_text(text[: text.rfind("\t")])  # the file ends inside the last line: its second sentence is lost
    with pytest.raises(DataFormatError, match=r"sts-test\.csv, line 4: 6 tab-separated field\(s\)"):
        evaluate_sts(ConstantModel(lambda s: [len(s), 1.0]), senteval, tasks=["STSBenchmark"])


def test_stsb_line_without_tab(senteval):
    path = _stsb(senteval)
    _edit_line(path, 1, lambda line: line.replace("\t", " "))
    with pytest.raises(DataFormatError, match=r"sts-test\.csv, line 2: 1 tab-separated field\(s\)"):
        read_sts_pairs(senteval, "STSBenchmark")


def test_stsb_non_numeric_score(senteval):
    path = _stsb(senteval)
    path.write_text(path.read_text().replace("\t1.5\t", "\tabc\t"))
    with pytest.raises(DataFormatError, match=r"sts-test\.csv, line 2: the gold score 'abc' is not a number"):
        read_sts_pairs(senteval, "STSBenchmark")


def test_stsb_nan_score(senteval):
    path = _stsb(senteval)
    path.write_text(path.read_text().replace("\t2.5\t", "\tnan\t"))
    with pytest.raises(DataFormatError, match=r"sts-test\.csv, line 3: the gold score 'nan' is not finite"):
        read_sts_pairs(senteval, "STSBenchmark")


def test_empty_stsb_file(senteval):
    _stsb(senteval).write_text("\n\n")
    with pytest.raises(DataFormatError, match=r"sts-test\.csv is empty"):
        read_sts_pairs(senteval, "STSBenchmark")


def test_binary_stsb_file(senteval):
    _stsb(senteval).write_bytes(b"main\tx\n\x89PNG\x00\x00\x01")
    with pytest.raises(DataFormatError, match=r"sts-test\.csv, line 2: binary content"):
        read_sts_pairs(senteval, "STSBenchmark")


def test_non_utf8_stsb_file(senteval):
    path = _stsb(senteval)
    path.write_bytes(path.read_bytes() + b"genre\tf\t2012\t0009\t1.0\tcaf\xe9\tok\n")
    with pytest.raises(DataFormatError, match=r"sts-test\.csv, line 5: not UTF-8"):
        read_sts_pairs(senteval, "STSBenchmark")


def test_stsb_blank_lines_are_skipped_and_counted_exactly(senteval):
    path = _stsb(senteval)
    path.write_text(path.read_text().replace("\n", "\n\n", 1) + "\n\n")
    assert read_sts_pairs(senteval, "STSBenchmark")[2] == [0.5, 1.5, 2.5, 3.5]


def test_sts_year_input_line_without_tab(senteval):
    path = senteval / "STS" / "STS13-en-test" / "STS.input.headlines.txt"
    _edit_line(path, 1, lambda line: line.replace("\t", "   "))
    with pytest.raises(DataFormatError, match=r"STS\.input\.headlines\.txt, line 2: 1 tab-separated field"):
        read_sts_pairs(senteval, "STS13")


def test_sts_year_gold_file_shorter_than_inputs(senteval):
    gold = senteval / "STS" / "STS12-en-test" / "STS.gs.MSRvid.txt"
    gold.write_text("1.1\n2.2\n")
    with pytest.raises(DataFormatError, match=r"STS\.input\.MSRvid\.txt has 3 lines but .*STS\.gs\.MSRvid\.txt has 2"
                                              r"[\s\S]*STS\.gs\.MSRvid\.txt ends early at line 2"):
        read_sts_pairs(senteval, "STS12")


def test_sts_year_non_numeric_gold(senteval):
    gold = senteval / "STS" / "STS16-en-test" / "STS.gs.plagiarism.txt"
    gold.write_text("1.1\nfive\n3.3\n")
    with pytest.raises(DataFormatError, match=r"STS\.gs\.plagiarism\.txt, line 2: the gold score 'five' is not a num"):
        read_sts_pairs(senteval, "STS16")


def test_sts_year_empty_gold_file(senteval):
    (senteval / "STS" / "STS15-en-test" / "STS.gs.belief.txt").write_text("")
    with pytest.raises(DataFormatError, match=r"STS\.gs\.belief\.txt is empty"):
        read_sts_pairs(senteval, "STS15")


def test_sts_year_unscored_lines_are_skipped_exactly(senteval):
    gold = senteval / "STS" / "STS13-en-test" / "STS.gs.FNWN.txt"
    gold.write_text("1.1\n\n3.3\n")
    inputs = (senteval / "STS" / "STS13-en-test" / "STS.input.FNWN.txt").read_text().splitlines()
    s1, s2, scores = read_sts_pairs(senteval, "STS13")
    assert scores[:2] == [1.1, 3.3] and len(scores) == 3 * 3 - 1
    assert (s1[1], s2[1]) == tuple(inputs[2].split("\t"))


def test_truncated_sick_line(senteval):
    path = senteval / "SICK" / "SICK_test_annotated.txt"
    _edit_line(path, 2, lambda line: "\t".join(line.split("\t")[:3]))
    with pytest.raises(DataFormatError, match=r"SICK_test_annotated\.txt, line 3: 3 tab-separated field\(s\), expected "
                                              r"at least 4"):
        read_sts_pairs(senteval, "SICKRelatedness")


def test_sick_header_only(senteval):
    path = senteval / "SICK" / "SICK_test_annotated.txt"
    path.write_text(path.read_text().splitlines()[0] + "\n")
    with pytest.raises(DataFormatError, match=r"SICK_test_annotated\.txt has a header but no sentence pairs"):
        read_sts_pairs(senteval, "SICKRelatedness")


def test_sick_non_numeric_score(senteval):
    path = senteval / "SICK" / "SICK_test_annotated.txt"
    path.write_text(path.read_text().replace("\t1.7\t", "\t-\t"))
    with pytest.raises(DataFormatError, match=r"SICK_test_annotated\.txt, line 3: the gold score '-' is not a number"):
        read_sts_pairs(senteval, "SICKRelatedness")


def test_binary_corpus(tmp_path):
    path = tmp_path / "corpus.bin"
    path.write_bytes(b"one sentence\n\x00\x01\x02")
    with pytest.raises(DataFormatError, match=r"corpus\.bin, line 2: binary content"):
        read_corpus(path)


# --------------------------------------------------------------------------- degenerate embeddings
@pytest.mark.parametrize(("matrix", "message"), [
    (np.array([[1.0, np.nan], [0.5, 0.2], [0.1, 0.3]]), r"non-finite \(NaN or infinite\) embeddings for 1 of 3"),
    (np.array([[1.0, 2.0], [np.inf, 0.0]]), r"non-finite \(NaN or infinite\) embeddings for 1 of 2"),
    (np.array([[0.0, 0.0], [0.5, 0.2], [0.0, 0.0]]), r"all-zero embeddings for 2 of 3"),
    (np.array([[0.3, 0.4]] * 5), r"the same embedding for all 5 distinct sentences"),
])
def test_check_embeddings(matrix, message):
    with pytest.raises(DegenerateEmbeddingsError, match=message):
        check_embeddings(matrix)


def test_check_embeddings_accepts_a_healthy_matrix_with_repeats():
    check_embeddings(np.array([[0.3, 0.4], [0.3, 0.4], [0.1, -0.2]]))  # two equal rows among three: fine


@pytest.mark.parametrize(("fill", "message"), [
    (lambda s: [np.nan, 1.0], "non-finite"),
    (lambda s: [0.0, 0.0], "all-zero"),
    (lambda s: [0.5, -0.5], "the same embedding"),
])
def test_evaluate_sts_refuses_degenerate_models(senteval, fill, message):
    with pytest.raises(DegenerateEmbeddingsError, match=message):
        evaluate_sts(ConstantModel(fill), senteval, tasks=["STSBenchmark", "SICKRelatedness"])


def test_cosine_spearman_with_equal_cosines_is_an_error():
    # every pair is (v, v) with exactly representable norms: all cosines are exactly 1 although the embeddings of
    # the three pairs differ (not a constant model); Spearman is undefined
    a = np.array([[1.0, 0.0], [0.0, 2.0], [3.0, 4.0]])
    with pytest.raises(DegenerateEmbeddingsError, match=r"all 3 cosine similarities equal 1 "):
        cosine_spearman(a, a.copy(), [1.0, 2.0, 3.0])


def test_cosine_spearman_with_constant_gold_is_an_error():
    a = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    with pytest.raises(ValueError, match="all gold scores are equal"):
        cosine_spearman(a, a[::-1], [2.0, 2.0, 2.0])


def test_cosine_spearman_valid_case_matches_hand_computation():
    a = np.array([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0]])
    b = np.array([[1.0, 0.0], [1.0, 1.0], [0.0, 1.0]])  # cosines 1, 0.707, 0: a strictly decreasing order
    assert cosine_spearman(a, b, [3.0, 2.0, 1.0]) == pytest.approx(100.0)
    assert cosine_spearman(a, b, [1.0, 2.0, 3.0]) == pytest.approx(-100.0)


def test_dev_evaluator_marks_a_degenerate_model_invalid_without_raising(senteval, caplog):
    evaluator = SentEvalSTSEvaluator(senteval, tasks=("STSBenchmark-dev",))
    with caplog.at_level(logging.WARNING, logger="st_hardneg.evaluation.sts"):
        metrics = evaluator(ConstantModel(lambda s: [np.nan, np.nan]), steps=7)
    assert metrics == {"sts-dev_spearman_STSBenchmark-dev": -100.0, "sts-dev_spearman": -100.0, "sts-dev_invalid": 1.0}
    assert INVALID_SCORE == -100.0  # the lowest possible Spearman x 100: every valid step ranks at least as high
    assert "INVALID" in caplog.text and "after 7 steps" in caplog.text and "non-finite" in caplog.text


def test_dev_evaluator_scores_a_healthy_model_normally(senteval):
    # embedding (1, x): cosine between two sentences depends on their lengths; compare with the hand value
    evaluator = SentEvalSTSEvaluator(senteval, tasks=("STSBenchmark-dev",))
    model = ConstantModel(lambda s: [1.0, float(len(s))])
    metrics = evaluator(model)
    s1, s2, gold = read_sts_pairs(senteval, "STSBenchmark-dev")
    cos = [(1 + len(a) * len(b)) / (np.hypot(1, len(a)) * np.hypot(1, len(b))) for a, b in zip(s1, s2, strict=True)]
    rank = lambda v: np.argsort(np.argsort(v))  # noqa: E731 - no ties in this data
    rc, rg = rank(cos), rank(gold)
    n = len(gold)
    expected = 100 * (1 - 6 * sum((x - y) ** 2 for x, y in zip(rc, rg, strict=True)) / (n * (n * n - 1)))
    assert metrics["sts-dev_spearman"] == pytest.approx(expected) and "sts-dev_invalid" not in metrics


def test_alignment_of_zero_embeddings_is_not_perfect():
    zeros = np.zeros((4, 3))
    with pytest.raises(DegenerateEmbeddingsError, match="all-zero embeddings for 8 of 8"):
        alignment(zeros, zeros)


def test_uniformity_of_collapsed_embeddings_is_refused():
    with pytest.raises(DegenerateEmbeddingsError, match="the same embedding for all 6"):
        uniformity(np.ones((6, 4)))


def test_alignment_uniformity_refuses_a_constant_model(senteval):
    with pytest.raises(DegenerateEmbeddingsError, match="the same embedding"):
        alignment_uniformity(ConstantModel(lambda s: [0.2, 0.9, 0.1]), senteval, threshold=0.0)


def test_transfer_refuses_nan_embeddings(shared_data):
    from st_hardneg.evaluation import evaluate_transfer

    with pytest.raises(DegenerateEmbeddingsError, match="non-finite"):
        evaluate_transfer(ConstantModel(lambda s: [np.nan] * 4), shared_data, tasks=["MRPC"], fast=True,
                          show_progress_bar=False)


# --------------------------------------------------------------------------- training plan and CLI
@pytest.mark.parametrize(("n", "kwargs", "steps"), [
    (130, {}, 2),                                       # 130 // 64, last partial batch dropped
    (130, {"epochs": 1.5}, 3),                          # int(2 * 1.5)
    (130, {"drop_last": False}, 3),                     # ceil(130 / 64)
    (130, {"max_steps": 5}, 5),
    (64, {}, 1),
])
def test_planned_steps(n, kwargs, steps):
    assert planned_steps(n, TrainConfig(batch_size=64, **kwargs)) == steps


def test_planned_steps_refuses_a_corpus_smaller_than_one_batch():
    with pytest.raises(ValueError, match="has 63 sentence\\(s\\), fewer than one batch of 64"):
        planned_steps(63, TrainConfig(batch_size=64))
    with pytest.raises(ValueError, match="zero training steps"):
        planned_steps(128, TrainConfig(batch_size=64, epochs=0.4))


def _train_argv(tmp_path, corpus, *extra):
    return ["train", "--corpus", str(corpus), "--output-dir", str(tmp_path / "out"), "--quiet", *extra]


def test_cli_corpus_smaller_than_one_batch(tmp_path, capsys):
    corpus = tmp_path / "small.txt"
    corpus.write_text("".join(f"sentence number {i}\n" for i in range(10)))
    assert cli.main(_train_argv(tmp_path, corpus)) == 2
    err = capsys.readouterr().err
    assert f"{corpus}: the corpus has 10 sentence(s), fewer than one batch of 64" in err
    assert "--batch-size" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()  # nothing saved, the model not even loaded


@pytest.mark.parametrize("steps", ["0", "-5"])
def test_cli_max_steps_without_real_steps(tmp_path, capsys, steps):
    corpus = tmp_path / "c.txt"
    corpus.write_text("".join(f"sentence number {i}\n" for i in range(100)))
    assert cli.main(_train_argv(tmp_path, corpus, "--max-steps", steps)) == 2
    assert f"--max-steps must be a positive number of steps (or -1: use --epochs), got {steps}" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_cli_batch_size_zero(tmp_path, capsys):
    corpus = tmp_path / "c.txt"
    corpus.write_text("one\ntwo\n")
    assert cli.main(_train_argv(tmp_path, corpus, "--batch-size", "0")) == 2
    assert "--batch-size must be >= 1, got 0" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["train", "eval"])
def test_cli_nonexistent_model_is_one_line(tmp_path, capsys, senteval, command):
    corpus = tmp_path / "c.txt"
    corpus.write_text("".join(f"sentence number {i}\n" for i in range(100)))
    argv = (_train_argv(tmp_path, corpus, "--batch-size", "8", "--data-dir", str(senteval)) if command == "train"
            else ["eval", "--data-dir", str(senteval)])
    assert cli.main([*argv, "--model", "/nonexistent/model"]) == 2
    err = capsys.readouterr().err
    assert err == (f"st-hardneg {command}: error: model not found: /nonexistent/model does not exist (pass a model "
                   "directory or a Hugging Face model name)\n")


def test_cli_binary_corpus_is_one_line(tmp_path, capsys):
    corpus = tmp_path / "c.txt"
    corpus.write_bytes(b"\x00\x01binary")
    assert cli.main(_train_argv(tmp_path, corpus)) == 2
    err = capsys.readouterr().err
    assert err.startswith("st-hardneg train: error: ") and "c.txt, line 1: binary content" in err
    assert len(err.strip().splitlines()) == 1


def test_cli_eval_on_a_truncated_file_names_it(tiny_model_dir, senteval, capsys):
    path = _stsb(senteval)
    path.write_text(path.read_text() + "genre\tfile\t2012\t0009\t2.0\n")
    assert cli.main(["eval", "--model", str(tiny_model_dir), "--data-dir", str(senteval), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "sts-test.csv, line 5: 5 tab-separated field(s), expected at least 7" in err
    assert "Traceback" not in err
