"""runs.py: pytrec_eval scoring by hand on a tiny case, TREC run / per-query files and their bad inputs."""

from __future__ import annotations

import math

import numpy as np
import pytest

from st_hardneg.evaluation.runs import (
    RunFormatError,
    check_qrels,
    read_per_query,
    read_trec_run,
    score_run,
    search,
    write_per_query,
    write_trec_run,
)


def test_score_run_uses_grades_as_gains_and_mteb_ties():
    run = {"q1": {"d1": 0.9, "d2": 0.8, "d3": 0.7}, "q2": {"d4": 0.5, "d5": 0.5}}
    qrels = {"q1": {"d2": 2, "d3": 1, "d9": 0}, "q2": {"d4": 1}}
    means, per_query = score_run(run, qrels, k_values=(1, 10))
    # q1: gains 0, 2, 1 at ranks 1-3; ideal 2, 1
    dcg = 2 / math.log2(3) + 1 / math.log2(4)
    ideal = 2 + 1 / math.log2(3)
    assert per_query["q1"]["ndcg@10"] == pytest.approx(100 * dcg / ideal)
    assert per_query["q1"]["mrr@10"] == pytest.approx(50.0) and per_query["q1"]["mrr@1"] == 0.0
    # q2: a tie, ranked by document id descending (trec_eval, mteb): d5 first, d4 second
    assert per_query["q2"]["mrr@10"] == pytest.approx(50.0)
    assert per_query["q2"]["ndcg@10"] == pytest.approx(100 / math.log2(3))
    assert means["recall@10"] == pytest.approx(100.0)
    assert means["ndcg@10"] == pytest.approx((per_query["q1"]["ndcg@10"] + per_query["q2"]["ndcg@10"]) / 2)


@pytest.mark.parametrize("grade", [-1, 1.5, True, "2"])
def test_a_grade_that_is_not_a_non_negative_integer_is_refused(grade):
    with pytest.raises(ValueError, match=r"qrels\['q1'\]\['d1'\] must be a non-negative integer grade"):
        check_qrels({"q1": {"d1": grade}})


def test_a_judged_query_missing_from_the_run_is_refused():
    with pytest.raises(ValueError, match="no ranking in the run, e.g. 'q2'"):
        score_run({"q1": {"d1": 1.0}}, {"q1": {"d1": 1}, "q2": {"d1": 1}})


def test_search_keeps_the_top_k_in_mteb_order():
    queries = np.array([[1.0, 0.0], [0.0, 1.0]], dtype=np.float32)
    docs = np.array([[1.0, 0.1], [0.0, 1.0], [1.0, 0.0], [0.5, 0.5]], dtype=np.float32)
    run = search(queries, docs, ["a", "b"], ["d0", "d1", "d2", "d3"], top_k=2)
    assert list(run["a"]) == ["d2", "d0"] and list(run["b"]) == ["d1", "d3"]
    assert run["a"]["d2"] == pytest.approx(1.0)


@pytest.mark.parametrize("queries, message", [
    (np.ones(3, dtype=np.float32), "query_embeddings must be a 2-D matrix"),
    (np.ones((1, 3), dtype=np.float32), "query_embeddings are 3 wide but doc_embeddings 2"),
    (np.ones((2, 2), dtype=np.float32), "query_embeddings has 2 rows for 1 ids"),
])
def test_search_names_the_bad_embeddings(queries, message):
    with pytest.raises(ValueError, match=message):
        search(queries, np.ones((2, 2), dtype=np.float32), ["q"], ["d1", "d2"])


def test_trec_run_round_trip_keeps_the_top_100(tmp_path):
    run = {"q1": {f"d{i}": float(i) for i in range(150)}, "q2": {"d1": 0.25}}
    path = write_trec_run(tmp_path / "run.trec", run)
    lines = path.read_text().splitlines()
    assert len(lines) == 101 and lines[0].split()[:4] == ["q1", "Q0", "d149", "1"]
    back = read_trec_run(path)
    assert len(back["q1"]) == 100 and back["q1"]["d149"] == 149.0 and back["q2"] == {"d1": 0.25}


def test_a_run_file_with_a_duplicated_pair_is_refused_naming_the_line(tmp_path):
    path = tmp_path / "run.trec"
    path.write_text("q1 Q0 d1 1 0.9 x\nq1 Q0 d2 2 0.8 x\nq1 Q0 d1 3 0.7 x\n")
    with pytest.raises(RunFormatError, match=r"run\.trec, line 3: the pair \('q1', 'd1'\) is listed twice "
                                              r"\(first on line 1\)"):
        read_trec_run(path)


@pytest.mark.parametrize("text, message", [
    ("q1 Q0 d1 1 0.9\n", "line 1: expected 6 fields"),
    ("q1 Q0 d1 1 nan x\n", "line 1: the score must be a finite number"),
    ("\n", "the run file is empty"),
])
def test_malformed_run_files_are_named(tmp_path, text, message):
    path = tmp_path / "run.trec"
    path.write_text(text)
    with pytest.raises(RunFormatError, match=message):
        read_trec_run(path)


def test_a_folder_where_a_run_file_is_expected_is_named_as_such(tmp_path):
    with pytest.raises(RunFormatError, match="is a folder, not a run file"):
        read_trec_run(tmp_path)
    with pytest.raises(RunFormatError, match="is a folder, not a per-query file"):
        read_per_query(tmp_path)
    with pytest.raises(FileNotFoundError, match="per-query file not found"):
        read_per_query(tmp_path / "absent.tsv")


def test_per_query_round_trip_and_bad_lines(tmp_path):
    table = {"t": {"q1": {"ndcg@10": 50.0, "mrr@10": 100.0}}, "u": {"q1": {"ndcg@10": 0.0, "mrr@10": 0.0}}}
    path = write_per_query(tmp_path / "pq.tsv", table, metrics=("ndcg@10", "mrr@10"))
    assert read_per_query(path) == table
    path.write_text(path.read_text() + "t\tq1\t1.0\t2.0\n")
    with pytest.raises(RunFormatError, match="line 4: query 'q1' of task 't' is listed twice"):
        read_per_query(path)
    path.write_text("query\tvalue\n")
    with pytest.raises(RunFormatError, match="line 1: expected the header"):
        read_per_query(path)


def test_a_run_file_is_written_only_when_it_can_be_read_back(tmp_path):
    import math

    import pytest

    from st_hardneg.evaluation.runs import read_trec_run, write_trec_run

    good = {"q1": {"d1": 0.5, "d2": 0.25}}
    assert read_trec_run(write_trec_run(tmp_path / "ok.trec", good, tag="my-run")) == good
    for run, tag, fragment in [({"q 1": {"d1": 1.0}}, "t", "the query id 'q 1'"),
                               ({"q1": {"d 1": 1.0}}, "t", "the document id 'd 1'"),
                               (good, "my run", "the tag 'my run'"),
                               ({"q1": {"d1": math.nan}}, "t", "is nan, not a finite number")]:
        with pytest.raises(ValueError, match=fragment):
            write_trec_run(tmp_path / "bad.trec", run, tag=tag)
        assert not (tmp_path / "bad.trec").exists()


def test_a_grade_pytrec_eval_cannot_hold_is_refused():
    import pytest

    from st_hardneg.evaluation.runs import MAX_GRADE, check_qrels

    assert check_qrels({"q": {"d": MAX_GRADE}}) == {"q": {"d": MAX_GRADE}}
    with pytest.raises(ValueError, match="cannot be scored exactly by pytrec_eval"):
        check_qrels({"q": {"d": MAX_GRADE + 1}})


@pytest.mark.parametrize(("text", "message"), [
    ("q1 Q0 d1 0.9 1 x\nq1 Q0 d2 0.8 2 x\n", r"line 1: the rank \(4th field\) must be a non-negative integer, got "
                                             r"'0\.9' \(are the rank and score columns swapped"),
    ("q1 Q0 d1 1 1 x\nq1 Q0 d2 2 2 x\n", r"line 2: query 'q1' ranks a document scored 2\.0 at rank 2, after one "
                                         r"scored 1\.0 at rank 1: the ranks must follow the scores"),
])
def test_a_run_whose_ranks_do_not_follow_its_scores_is_refused(tmp_path, text, message):
    from st_hardneg.evaluation.runs import RunFormatError, read_trec_run

    path = tmp_path / "run.trec"
    path.write_text(text)
    with pytest.raises(RunFormatError, match=message):
        read_trec_run(path)
    path.write_text("q1 Q0 d2 2 0.8 x\nq1 Q0 d1 1 0.9 x\nq1 Q0 d3 3 0.8 x\n")  # any line order, ties allowed
    assert read_trec_run(path) == {"q1": {"d2": 0.8, "d1": 0.9, "d3": 0.8}}


def test_a_run_with_nan_or_infinite_scores_is_not_scored():
    from st_hardneg.evaluation.runs import score_run

    qrels = {"q1": {"d1": 1}}
    for bad in (float("nan"), float("inf"), "high"):
        with pytest.raises(ValueError, match=r"score of \('q1', 'd2'\) is .*not a finite number"):
            score_run({"q1": {"d1": 0.5, "d2": bad}}, qrels)
    means, _ = score_run({"q1": {"d1": 0.5, "d2": 0.9}}, qrels)
    assert means["mrr@10"] == pytest.approx(50.0)  # d1 at rank 2: 1/2
