"""benchmarks.known_relevance_share: the no-duplicates batches and the counts, by hand; the committed table."""

from __future__ import annotations

import json
from pathlib import Path

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
