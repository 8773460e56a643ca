"""benchmarks.known_relevance_share: the no-duplicates batches and the counts, by hand; the committed table; its records
file. The study spec and its runs: ``tests/studies/test_measure_known_relevance_share.py``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import known_relevance_share as krs

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def test_batches_are_full_seeded_and_never_repeat_a_text():
    rows = [(f"q{i % 7}", f"d{i}") for i in range(40)]  # 7 distinct queries: a batch holds at most 7 rows
    batches = krs.no_duplicate_batches(rows, 4, seed=0)
    assert batches == krs.no_duplicate_batches(rows, 4, seed=0)
    assert batches != krs.no_duplicate_batches(rows, 4, seed=1)
    for batch in batches:
        texts = [t for row in batch for t in row]
        assert len(batch) == 4 and len(set(texts)) == 8


def test_counts_on_a_hand_built_split(monkeypatch):
    class Split:
        known_paraphrases = {"qa": {"d1", "d2"}, "qb": {"d2"}}
        train_pairs = [("qa", "d1"), ("qb", "d2"), ("qc", "d3"), ("qd", "d4")]

    class Prep:
        name, split = "tiny", Split()

    monkeypatch.setattr("benchmarks.retrieval_beir_round2.prepare", lambda *args, **kwargs: Prep())
    row = krs.share(Path("unused"), seed=0, batch_size=4)
    # one batch of the 4 rows: qa sees d2 (known relevant), qb sees d1 (not), qc and qd see nothing known
    assert (row["rows"], row["rows_with_a_known_relevant_candidate"], row["candidates"],
            row["known_relevant_candidates"]) == (4, 1, 12, 1)
    assert row["row_share"] == 25.0 and row["candidate_share"] == round(100 / 12, 3)


def test_committed_table_is_rendered_from_its_json():
    saved = json.loads((RESULTS / "known_relevance_share.json").read_text())
    assert (RESULTS / "known_relevance_share.md").read_text() == krs.markdown(saved["rows"])
    assert {r["dataset"] for r in saved["rows"]} == {"scifact", "nfcorpus"}


def test_the_studys_renderer_and_records_file():
    saved = json.loads((RESULTS / "known_relevance_share.json").read_text())
    assert krs.table(saved) == (RESULTS / "known_relevance_share.md").read_text()
    records, meta = krs.read(saved)
    assert records == saved["rows"] and meta == {"protocol": {"batch_size": 32}, "row": "in_batch"}
    assert krs.layout(records, meta) == saved
    new = {**saved["rows"][0], "seed": 7, "batch_size": 32}  # a new row carries its batch size: lifted to the top
    assert krs.layout([*records, new], meta) == {"batch_size": 32, "rows": [*saved["rows"], saved["rows"][0] | {"seed": 7}]}
    assert krs.layout([{**new, "batch_size": 4}], {}) == {"batch_size": 4, "rows": [saved["rows"][0] | {"seed": 7}]}
    with pytest.raises(ValueError, match="one batch size"):
        krs.layout([*records, {**new, "batch_size": 4}], meta)


def test_pairs_that_fill_no_batch_are_refused(monkeypatch):
    class Split:
        known_paraphrases: dict[str, set[str]] = {}
        train_pairs = [("qa", "d1"), ("qb", "d2")]

    class Prep:
        name, split = "tiny", Split()

    monkeypatch.setattr("benchmarks.retrieval_beir_round2.prepare", lambda *args, **kwargs: Prep())
    with pytest.raises(ValueError, match="its 2 training pairs fill no batch of 4 rows"):
        krs.share(Path("unused"), seed=0, batch_size=4)
