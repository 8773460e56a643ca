"""The known-relevance share study (``benchmarks/studies/known_relevance_share.json``): its committed rows imported as
finished trials and its table rendered from them byte for byte; its trial run through the one runner on a tiny BEIR
folder (the counts made again by hand) and on the shared SciFact (the committed row made again)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("optuna")

REPO = Path(__file__).resolve().parents[2]
SPEC = REPO / "benchmarks" / "studies" / "known_relevance_share.json"
RESULTS = REPO / "benchmarks" / "results"


def runner(*argv: str) -> int:
    from benchmarks.studies.__main__ import main

    return main(list(argv))


def test_the_committed_rows_are_the_finished_trials_and_render_byte_for_byte():
    from benchmarks.studies.render import import_study, render
    from st_hardneg.training.studies.engine import progress

    spec, study = import_study(SPEC)
    state = progress(study, [point.key for point in spec.points()])
    assert state.left == [] and state.failed == {}
    assert sorted(state.done) == sorted(f"{d}/in_batch/{s}" for d in ("scifact", "nfcorpus") for s in (0, 1, 2))
    committed = json.loads((RESULTS / "known_relevance_share.json").read_text())
    assert [t.user_attrs["record"] for t in study.get_trials()] == committed["rows"]
    md = RESULTS / "known_relevance_share.md"
    assert render(SPEC, spec, study) == {md: md.read_text()}


def spec_copy(tmp_path: Path, datasets: dict, seeds: list[int], batch_size: int) -> Path:
    raw = json.loads(SPEC.read_text())
    raw["protocol"] = {"batch_size": batch_size}
    raw["datasets"] = datasets
    raw["grid"] = [{"datasets": list(datasets), "rows": ["in_batch"], "seeds": seeds}]
    raw["report"]["records"] = str(tmp_path / "results" / "share.json")
    raw["report"]["outputs"] = [{**raw["report"]["outputs"][0], "file": str(tmp_path / "results" / "share.md")}]
    path = tmp_path / "spec.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(raw))
    return path


def by_hand(pairs: list[tuple[str, str]], batch_size: int, seed: int) -> tuple[int, int, int, int]:
    """(rows, rows with a known-relevant candidate, candidates, known-relevant candidates), the known relevance of a
    query read from the pairs (on a tiny folder every judgement of a training query is a pair)."""
    import random

    known: dict[str, set[str]] = {}
    for query, doc in pairs:
        known.setdefault(query, set()).add(doc)
    order = list(pairs)
    random.Random(seed).shuffle(order)
    batches, batch, texts = [], [], set()
    for query, doc in order:
        if query not in texts and doc not in texts:
            batch.append((query, doc))
            texts |= {query, doc}
            if len(batch) == batch_size:
                batches.append(batch)
                batch, texts = [], set()
    hit_rows = hits = 0
    for batch in batches:
        for i, (query, _) in enumerate(batch):
            found = sum(doc in known[query] for j, (_, doc) in enumerate(batch) if j != i)
            hits += found
            hit_rows += found > 0
    rows = len(batches) * batch_size
    return rows, hit_rows, rows * (batch_size - 1), hits


def test_a_run_on_a_tiny_beir_folder_counts_what_a_hand_count_gives(tmp_path):
    from benchmarks import known_relevance_share as krs
    from benchmarks.retrieval_beir_round2 import prepare
    from st_hardneg.testing.beir import make_tiny_beir
    from st_hardneg.training.protocol import BEIR_TRAINING
    from st_hardneg.training.sampling import PAIR_SAMPLING
    from st_hardneg.training.studies.engine import provenance

    folder = make_tiny_beir(tmp_path / "tiny", train_queries=40)
    spec = spec_copy(tmp_path, {"tiny": {"folder": str(folder)}}, [0, 1], batch_size=4)
    assert runner(str(spec), "--run", "--work-dir", str(tmp_path / "work"), "-q") == 0
    data = json.loads((tmp_path / "results" / "share.json").read_text())
    assert data["batch_size"] == 4 and sorted((r["dataset"], r["seed"]) for r in data["rows"]) == [("tiny", 0), ("tiny", 1)]
    pairs = prepare("tiny", folder, BEIR_TRAINING["dev_fraction"], dict(PAIR_SAMPLING)).split.train_pairs
    judged = sum(1 for line in (folder / "qrels" / "train.tsv").read_text().splitlines()[1:] if line.strip())
    for row in data["rows"]:
        assert 0 < row["pairs"] == len(pairs) < judged  # the dev share of the training queries is carved out
        rows, hit_rows, candidates, hits = by_hand(pairs, 4, row["seed"])
        assert (row["rows"], row["rows_with_a_known_relevant_candidate"], row["candidates"],
                row["known_relevant_candidates"]) == (rows, hit_rows, candidates, hits)
        assert row["batches"] == rows // 4 and row["row_share"] == round(100 * hit_rows / rows, 2)
        assert row["candidate_share"] == round(100 * hits / candidates, 3)
        assert row["commit"] == provenance()["commit"] and row["library"] == provenance()["library"]
    assert any(row["known_relevant_candidates"] for row in data["rows"])  # the count is not trivially zero
    assert (tmp_path / "results" / "share.md").read_text() == krs.markdown(data["rows"])
    assert sorted(p.name for p in (tmp_path / "work").iterdir()) == ["study.db"]


def test_a_run_on_the_shared_scifact_makes_the_committed_row_again(tmp_path, shared_data):
    spec = spec_copy(tmp_path, {"scifact": {"folder": "retrieval/scifact"}}, [0], batch_size=32)
    assert runner(str(spec), "--run", "--data-dir", str(shared_data), "--work-dir", str(tmp_path / "work"), "-q") == 0
    (row,) = json.loads((tmp_path / "results" / "share.json").read_text())["rows"]
    committed = json.loads((RESULTS / "known_relevance_share.json").read_text())["rows"]
    assert {k: v for k, v in row.items() if k not in ("commit", "library")} == committed[0]
    assert (committed[0]["dataset"], committed[0]["seed"]) == ("scifact", 0)


def test_bad_input_is_refused_in_one_line(tmp_path, capsys):
    missing = spec_copy(tmp_path, {"gone": {"folder": str(tmp_path / "gone")}}, [0], batch_size=32)
    small = spec_copy(tmp_path / "b", {"scifact": {"folder": "retrieval/scifact"}}, [0], batch_size=16)
    (tmp_path / "b" / "results").mkdir(parents=True)
    (tmp_path / "b" / "results" / "share.json").write_text((RESULTS / "known_relevance_share.json").read_text())
    from st_hardneg.testing.beir import make_tiny_beir

    untrained = make_tiny_beir(tmp_path / "c" / "tiny")
    (untrained / "qrels" / "train.tsv").unlink()
    no_train = spec_copy(tmp_path / "c", {"tiny": {"folder": str(untrained)}}, [0], batch_size=4)
    for spec, message in ((missing, "dataset 'gone': no BEIR folder at"),
                          (no_train, "has no qrels/train.tsv, which the study needs (train split)"),
                          (small, "made under another protocol than the spec's (changed: batch_size)")):
        with pytest.raises(SystemExit) as stop:
            runner(str(spec), "--run", "--work-dir", str(spec.parent / "work"))
        assert stop.value.code == 2
        assert message in capsys.readouterr().err
    assert not (tmp_path / "results").exists() and not (tmp_path / "c" / "results").exists()
