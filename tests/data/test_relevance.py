"""``st_hardneg.data.relevance``: the one mapping of known relevance (anchor text → relevant texts) that the losses
mask and mining excludes, from BEIR qrels or a group column."""

from __future__ import annotations

import warnings

import pytest

from st_hardneg.data.relevance import known_positives_from_groups, known_positives_from_qrels

QUERIES = {"q1": "what is a cat?", "q2": "how hot is the sun?", "q3": "what is a cat?"}
CORPUS = {"d1": "cats are small felines.", "d2": "the sun is hot.", "d3": "a cat purrs.", "d4": "dogs bark."}


def test_qrels_with_scores_keep_the_relevant_ones_as_texts():
    qrels = {"q1": {"d1": 1, "d4": 0}, "q2": {"d2": 2}, "q3": {"d3": 1}}
    known = known_positives_from_qrels(QUERIES, CORPUS, qrels)
    # q1 and q3 share their text: their documents are merged; d4 (score 0) is not relevant
    assert known == {"what is a cat?": frozenset({"cats are small felines.", "a cat purrs."}),
                     "how hot is the sun?": frozenset({"the sun is hot."})}
    assert known_positives_from_qrels(QUERIES, CORPUS, qrels, min_score=2) == {
        "how hot is the sun?": frozenset({"the sun is hot."})}


def test_qrels_as_sets_of_ids():
    known = known_positives_from_qrels(QUERIES, CORPUS, {"q2": {"d2", "d4"}})
    assert known == {"how hot is the sun?": frozenset({"the sun is hot.", "dogs bark."})}


def test_ids_absent_from_the_data_are_counted_and_reported_once():
    qrels = {"q1": {"d1": 1, "d9": 1, "d8": 1}, "q7": {"d2": 1}}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        known = known_positives_from_qrels(QUERIES, CORPUS, qrels)
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1
    assert "1 query id(s) absent from queries (e.g. 'q7')" in messages[0]
    assert "2 judgement(s) naming a document id absent from corpus (e.g. 'd9')" in messages[0]
    assert known == {"what is a cat?": frozenset({"cats are small felines."})}


def test_nothing_relevant_warns_that_nothing_can_be_masked():
    with pytest.warns(UserWarning, match="known_positives is empty"):
        assert known_positives_from_qrels(QUERIES, CORPUS, {"q1": {"d1": 0}}) == {}


@pytest.mark.parametrize("qrels,match", [
    ({1: {"d1": 1}}, "query id 1"),
    ({"q1": {2: 1}}, "document id 2"),
    ({"q1": "d1"}, "is the string"),
    ({"q1": {"d1": "1"}}, "a relevance score is a number"),
    ({"q1": 5}, "must map document ids"),
])
def test_bad_qrels_are_refused_naming_the_entry(qrels, match):
    with pytest.raises(TypeError, match=match):
        known_positives_from_qrels(QUERIES, CORPUS, qrels)


def test_tables_must_be_mappings():
    with pytest.raises(TypeError, match="corpus must be a mapping"):
        known_positives_from_qrels(QUERIES, ["d1"], {})


def test_a_group_column_makes_every_member_a_known_positive_of_the_others():
    texts = ["a", "b", "c", "d", "e"]
    groups = [1, 1, 2, 1, 3]
    known = known_positives_from_groups(texts, groups)
    assert known == {"a": frozenset({"b", "d"}), "b": frozenset({"a", "d"}), "d": frozenset({"a", "b"})}


@pytest.mark.parametrize("texts,groups,error,match", [
    (["a", "b"], [1], ValueError, "one group id per text"),
    (["a", 2], [1, 1], TypeError, r"texts\[1\]"),
    (["a", "b"], [1, None], TypeError, r"groups\[1\] is None"),
    (["a", "b"], [1, [2]], TypeError, "not hashable"),
])
def test_bad_group_columns_are_refused(texts, groups, error, match):
    with pytest.raises(error, match=match):
        known_positives_from_groups(texts, groups)


def test_the_beir_loader_feeds_it(tmp_path):
    """From a BEIR folder through ``load_beir``: the train qrels as texts."""
    from st_hardneg.data.beir import load_beir

    (tmp_path / "qrels").mkdir()
    (tmp_path / "corpus.jsonl").write_text(
        '{"_id": "d1", "title": "", "text": "cats are small felines."}\n'
        '{"_id": "d2", "title": "Sun", "text": "the sun is hot."}\n')
    (tmp_path / "queries.jsonl").write_text('{"_id": "q1", "text": "what is a cat?"}\n'
                                            '{"_id": "q2", "text": "how hot is the sun?"}\n')
    (tmp_path / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td2\t1\nq2\td1\t0\n")
    data = load_beir(tmp_path)
    known = known_positives_from_qrels(data.queries, data.corpus, data.qrels["train"])
    assert known == {"what is a cat?": frozenset({data.corpus["d1"]}),
                     "how hot is the sun?": frozenset({data.corpus["d2"]})}
