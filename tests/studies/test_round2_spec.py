"""Retrieval round 2 written as a study spec (``benchmarks/studies/retrieval_beir_round2.json``): its committed
records imported as finished trials, nothing left to run, and its report rendered from those trials byte for byte."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("optuna")

REPO = Path(__file__).resolve().parents[2]
SPEC = REPO / "benchmarks" / "studies" / "retrieval_beir_round2.json"
RESULTS = REPO / "benchmarks" / "results"


@pytest.fixture(scope="module")
def imported():
    from benchmarks.studies.render import import_study

    return import_study(SPEC)


@pytest.fixture(scope="module")
def records():
    return json.loads((RESULTS / "retrieval_beir_round2.json").read_text())


def test_the_spec_with_nothing_left_renders_the_committed_report_byte_for_byte(imported):
    from benchmarks.studies.render import render
    from st_hardneg.training.studies.engine import progress

    spec, study = imported
    state = progress(study, [point.key for point in spec.points()])
    assert state.left == [] and state.failed == {} and len(state.done) == 156
    tables = render(SPEC, spec, study)
    assert list(tables) == [RESULTS / "retrieval_beir_round2.md"]
    assert tables[RESULTS / "retrieval_beir_round2.md"] == (RESULTS / "retrieval_beir_round2.md").read_text()


def test_each_record_is_one_finished_trial_with_its_provenance(imported, records):
    from benchmarks.studies.render import import_study
    from st_hardneg.training.studies.engine import import_records

    spec, study = imported
    trials = study.get_trials()
    assert [t.user_attrs["record"] for t in trials] == records["runs"]  # in order, every field as committed
    assert all(t.state.name == "COMPLETE" and t.value == t.user_attrs["dev"]["ndcg@10"] for t in trials)
    for trial, run in zip(trials, records["runs"], strict=True):
        assert trial.params["point"] == f"{run['dataset']}/{run['method']}/{'-' if run['seed'] is None else run['seed']}"
        assert trial.user_attrs["commit"] == run.get("commit", "unknown")
        library = run.get("library") or records["library_trees"].get(run.get("commit", ""), "unknown")
        assert trial.user_attrs["library"] == library
        assert trial.user_attrs.get("per_query") == run.get("per_query")
    # importing again adds nothing: a finished point stays as it is
    assert import_records(study, spec, records["runs"], lambda r: __import__(
        "benchmarks.studies.render", fromlist=["point_of"]).point_of(r), source="again") == 0
    assert callable(import_study)


def test_the_specs_rows_are_the_configurations_the_records_ran(imported, records):
    spec, _ = imported
    current = {"mixcse": "mixcse_two_way"}  # the records' name of MixCSE's two-direction form
    for run in records["runs"]:
        row = spec.rows[run["method"]]
        if "loss" not in run:  # the published model, evaluated only
            assert row.loss is None
            continue
        assert row.loss == current.get(run["loss"], run["loss"])
        assert dict(row.options) == run["options"]
        assert row.control == run["known_positives"]
        assert row.extra["mining"] == run["mining"] and row.extra["builtin"] == run["builtin"]
        assert row.extra.get("batch_size", 32) == run["batch_size"]
    points = {point.key for point in spec.points()}
    assert points == {f"{r['dataset']}/{r['method']}/{'-' if r['seed'] is None else r['seed']}"
                      for r in records["runs"]}
