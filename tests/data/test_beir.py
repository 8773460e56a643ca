"""BEIR folders: graded qrels, CRLF line ends, and the bad inputs named with file and line."""

from __future__ import annotations

import pytest

from st_hardneg.data.beir import BEIRFormatError, GradedRetrievalTask, load_beir
from st_hardneg.data.senteval import DataNotFoundError
from st_hardneg.testing.beir import make_tiny_beir


@pytest.fixture
def root(tmp_path):
    return make_tiny_beir(tmp_path / "tiny")


def _set_test_qrels(root, lines, end="\n"):
    (root / "qrels" / "test.tsv").write_text(end.join(["query-id\tcorpus-id\tscore", *lines]) + end)


def test_crlf_graded_qrels_keep_their_grades(root):
    rows = [line.split("\t") for line in (root / "qrels" / "test.tsv").read_text().splitlines()[1:]]
    q, d1, _ = rows[0]
    q2, d2, _ = next(row for row in rows if row[0] != q)
    _set_test_qrels(root, [f"{q}\t{d1}\t2", f"{q2}\t{d2}\t1", f"{q}\t{d2}\t0"], end="\r\n")
    task = load_beir(root).task("test")
    assert isinstance(task, GradedRetrievalTask)
    assert task.qrels[q] == {d1: 2, d2: 0} and task.relevant_docs[q] == {d1}
    assert set(task.queries) == {q, q2}


@pytest.mark.parametrize("grade, message", [("-1", "the score must be a non-negative integer grade, got '-1'"),
                                            ("1.5", "the score must be an integer, got '1.5'")])
def test_a_grade_that_is_negative_or_not_an_integer_is_named_with_file_and_line(root, grade, message):
    q, d, _ = (root / "qrels" / "test.tsv").read_text().splitlines()[1].split("\t")
    _set_test_qrels(root, [f"{q}\t{d}\t{grade}"])
    with pytest.raises(BEIRFormatError, match=rf"test\.tsv, line 2: {message}"):
        load_beir(root)


def test_an_empty_qrels_or_corpus_file_is_named(root, tmp_path):
    (root / "qrels" / "test.tsv").write_text("")
    with pytest.raises(BEIRFormatError, match=r"test\.tsv: no judgement in the file"):
        load_beir(root)
    other = make_tiny_beir(tmp_path / "other")
    (other / "corpus.jsonl").write_text("\n")
    with pytest.raises(BEIRFormatError, match=r"corpus\.jsonl: no document in the file"):
        load_beir(other)


def test_a_missing_id_is_named_with_file_and_line(root):
    (root / "queries.jsonl").write_text((root / "queries.jsonl").read_text() + '{"text": "no id"}\n')
    with pytest.raises(BEIRFormatError, match=r"queries\.jsonl, line \d+: a query needs the key\(s\) \['_id'\]"):
        load_beir(root)


def test_a_qrels_id_absent_from_the_corpus_is_named(root):
    q = (root / "qrels" / "test.tsv").read_text().splitlines()[1].split("\t")[0]
    _set_test_qrels(root, [f"{q}\tnot-a-doc\t1"])
    with pytest.raises(BEIRFormatError, match=r"test\.tsv, line 2: corpus id 'not-a-doc' is not in corpus\.jsonl"):
        load_beir(root)


def test_an_unknown_split_names_the_splits_there_are(root):
    with pytest.raises(ValueError, match="has no split 'dev'; its qrels files are: test, train"):
        load_beir(root).task("dev")


def test_a_file_or_folder_of_the_wrong_kind_is_named_as_such(root):
    with pytest.raises(DataNotFoundError, match="is a file, not a BEIR folder"):
        load_beir(root / "corpus.jsonl")
    (root / "queries.jsonl").unlink()
    (root / "queries.jsonl").mkdir()
    with pytest.raises(DataNotFoundError, match=r"queries\.jsonl is a folder, not the BEIR file"):
        load_beir(root)


@pytest.mark.parametrize("grade, message", [
    ("1_0", "the score must be an integer, got '1_0'"),
    ("+1", "the score must be an integer, got '+1'"),
    ("٣", "the score must be an integer, got '٣'"),
    (str(10**30), "the grade 1000000000000000000000000000000 is above 2,147,483,647"),
])
def test_a_grade_python_would_misread_or_pytrec_eval_truncate_is_named(root, grade, message):
    import re

    q, d, _ = (root / "qrels" / "test.tsv").read_text().splitlines()[1].split("\t")
    _set_test_qrels(root, [f"{q}\t{d}\t{grade}"])
    with pytest.raises(BEIRFormatError, match=rf"test\.tsv, line 2: {re.escape(message)}"):
        load_beir(root)


def test_a_bom_and_spaces_around_ids_are_read_the_same_in_every_file(root):
    """A UTF-8 BOM (Windows editors write one) and spaces around an id are not part of the id, in the corpus, the
    queries and the qrels alike."""
    expected = load_beir(root).task("test")
    for name in ("corpus.jsonl", "queries.jsonl"):
        path = root / name
        lines = path.read_text().splitlines()
        lines = [line.replace('"_id": "', '"_id": " ', 1) for line in lines]
        path.write_text("\ufeff" + "\n".join(lines) + "\n", encoding="utf-8")
    qrels = root / "qrels" / "test.tsv"
    qrels.write_text("\ufeff" + qrels.read_text(), encoding="utf-8")
    task = load_beir(root).task("test")
    assert task.qrels == expected.qrels and task.queries == expected.queries


def test_gzip_and_utf16_files_are_named_with_the_fix(root):
    import gzip

    corpus = root / "corpus.jsonl"
    text = corpus.read_text()
    corpus.write_bytes(gzip.compress(text.encode()))
    with pytest.raises(BEIRFormatError, match=r"corpus\.jsonl is gzip-compressed: decompress it first"):
        load_beir(root)
    corpus.write_text(text, encoding="utf-16")
    with pytest.raises(BEIRFormatError, match=r"corpus\.jsonl is not UTF-8 text .*it is UTF-16: save it as UTF-8"):
        load_beir(root)
