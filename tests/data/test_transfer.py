"""Transfer-data lines that cannot be parsed are named with their file and line."""

from __future__ import annotations

import pytest

from st_hardneg.data.senteval import DataFormatError, DataNotFoundError
from st_hardneg.data.transfer import read_transfer_task


def _trec(root, train_lines):
    (root / "TREC").mkdir(parents=True)
    (root / "TREC" / "train_5500.label").write_text("\n".join(train_lines) + "\n", encoding="latin-1")
    (root / "TREC" / "TREC_10.label").write_text("NUM:date When was it ?\n", encoding="latin-1")
    return root


def test_trec_line_without_a_label_is_named_with_file_and_line(tmp_path):
    root = _trec(tmp_path, ["DESC:def What is a cat ?", "What is a dog ?"])
    with pytest.raises(DataFormatError, match=r"train_5500\.label, line 2: expected 'LABEL:fine question'"):
        read_transfer_task(root, "TREC")


def test_trec_unknown_label_is_named_with_file_and_line(tmp_path):
    root = _trec(tmp_path, ["FOO:bar What is a cat ?"])
    with pytest.raises(DataFormatError, match=r"train_5500\.label, line 1: unknown label 'FOO'"):
        read_transfer_task(root, "TREC")


def test_trec_reads_labels_and_questions(tmp_path):
    root = _trec(tmp_path, ["DESC:def What is a cat ?", "HUM:ind Who is it ?"])
    splits = read_transfer_task(root, "TREC")
    assert sorted(zip(splits["train"].sentences, splits["train"].labels.tolist(), strict=True)) == [
        ("What is a cat ?", 1), ("Who is it ?", 3)]


def test_sst2_line_without_a_label_is_named(tmp_path):
    folder = tmp_path / "SST" / "binary"
    folder.mkdir(parents=True)
    for split in ("train", "dev", "test"):
        (folder / f"sentiment-{split}").write_text("good film\t1\nno label here\n")
    with pytest.raises(DataFormatError, match=r"sentiment-train, line 2: expected 'sentence<TAB>label'"):
        read_transfer_task(tmp_path, "SST2")


def test_a_folder_where_a_transfer_file_is_expected_is_named_as_such(tmp_path):
    (tmp_path / "TREC" / "train_5500.label").mkdir(parents=True)
    (tmp_path / "TREC" / "TREC_10.label").write_text("NUM:date When ?\n")
    with pytest.raises(DataNotFoundError, match=r"train_5500\.label is a folder, not the SentEval transfer file"):
        read_transfer_task(tmp_path, "TREC")
