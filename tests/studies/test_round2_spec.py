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


def test_the_specs_protocol_rows_and_hooks_are_the_rounds_own(imported, records):
    """The spec states the round's protocol (what its records file holds), each trained row as the round's module
    defines it (loss, options, control, mining), and the runner's hooks: its trial, the mining before the workers,
    the records file with its per-query file, and the report's renderers."""
    from benchmarks import retrieval_beir_round2 as r2
    from benchmarks import retrieval_beir_rows as rows
    from benchmarks.studies.render import hook

    spec, _ = imported
    assert dict(spec.protocol) == rows.PROTOCOL == records["protocol"]
    every = rows.all_rows()
    for label, row in spec.rows.items():
        if row.loss is None:
            assert label == "untrained" and label not in every
            continue
        assert every[label].config() == row.config(), label
    assert hook(spec.trial) is r2.run_trial
    assert hook(spec.report["prepare"]) is r2.mine_left and hook(spec.report["write"]) is r2.write_results
    assert [hook(o["renderer"]) for o in spec.report["outputs"]] == [r2.markdown, r2.plot]
    # the per-query file the write hook keeps beside the records is the one the renderer reads
    assert SPEC.parent.joinpath(spec.report["per_query"]).resolve() == RESULTS / "retrieval_beir_round2_per_query.jsonl"


def test_the_runner_checks_the_committed_tables_identical(capsys):
    from benchmarks.studies.__main__ import main

    assert main([str(SPEC), "--check"]) == 0
    assert capsys.readouterr().out == "retrieval_beir_round2.md: identical\n"
