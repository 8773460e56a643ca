"""Data readers name a path of the wrong kind as such."""

from __future__ import annotations

import pytest

from st_hardneg.data.senteval import DataNotFoundError, check_sts_data, read_corpus


def test_read_corpus_on_a_folder_says_it_is_a_folder(tmp_path):
    with pytest.raises(IsADirectoryError, match="is a folder, not a file"):
        read_corpus(tmp_path)
    with pytest.raises(FileNotFoundError, match="not found"):
        read_corpus(tmp_path / "absent.txt")


def test_a_folder_where_an_sts_file_is_expected_is_named_as_such(tmp_path):
    (tmp_path / "STS" / "STSBenchmark" / "sts-test.csv").mkdir(parents=True)
    with pytest.raises(DataNotFoundError, match=r"sts-test\.csv is a folder, not the SentEval file"):
        check_sts_data(tmp_path, ["STSBenchmark"])
