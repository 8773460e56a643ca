"""The overhead study (``benchmarks/studies/overhead.json``): its committed measurement imported as the one finished
trial and its table rendered from it byte for byte; a smoke run of its trial (the interleaved measurement of a group
of methods on a tiny random model) through the one runner, its record's numbers checked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("optuna")

REPO = Path(__file__).resolve().parents[2]
SPEC = REPO / "benchmarks" / "studies" / "overhead.json"
RESULTS = REPO / "benchmarks" / "results"


def runner(*argv: str) -> int:
    from benchmarks.studies.__main__ import main

    return main(list(argv))


def test_the_committed_measurement_is_the_one_finished_trial_and_renders_byte_for_byte():
    from benchmarks.studies.render import import_study, render
    from st_hardneg.training.studies.engine import progress

    spec, study = import_study(SPEC)
    state = progress(study, [point.key for point in spec.points()])
    assert state.left == [] and state.failed == {} and list(state.done) == ["wiki10k/interleaved/0"]
    committed = json.loads((RESULTS / "overhead.json").read_text())
    (trial,) = study.get_trials()
    assert trial.user_attrs["record"] == committed and trial.user_attrs["commit"] == "unknown"
    # the row's group is the committed file's methods, in its order
    assert ["mnrl", *spec.rows["interleaved"].extra["methods"][1:]] == [k for k in committed if k != "_meta"]
    assert render(SPEC, spec, study) == {RESULTS / "overhead.md": (RESULTS / "overhead.md").read_text()}


def smoke_spec(tmp_path: Path) -> Path:
    raw = json.loads(SPEC.read_text())
    raw["rows"]["interleaved"]["extra"]["methods"] = ["mixcse", "adcse"]
    raw["report"]["records"] = str(tmp_path / "results" / "overhead.json")
    raw["report"]["outputs"] = [{**raw["report"]["outputs"][0], "file": str(tmp_path / "results" / "overhead.md")}]
    path = tmp_path / "overhead.json"
    path.write_text(json.dumps(raw))
    return path


def test_a_smoke_run_measures_the_group_in_one_trial(tiny_model_dir, shared_data, tmp_path, capsys):
    from benchmarks import overhead
    from st_hardneg.training.studies.engine import provenance

    spec = smoke_spec(tmp_path)
    work = tmp_path / "work"
    sets = ["--set", f"model={tiny_model_dir}", "--set", "steps=3", "--set", "warmup=1", "--set", "loss_reps=3"]
    assert runner(str(spec), "--run", "--data-dir", str(shared_data), "--work-dir", str(work), *sets, "-q") == 0
    out = tmp_path / "results" / "overhead.json"
    results = json.loads(out.read_text())
    assert set(results) == {"mnrl", "mixcse", "adcse", "_meta"}
    assert results["mnrl"]["step_ratio_vs_mnrl"] == 1.0
    for name in ("mnrl", "mixcse", "adcse"):
        row = results[name]
        assert row["step_ms"] > 0 and row["loss_only_ms"] > 0 and row["steps_measured"] == 3
        assert row["loss_only_share_of_step"] == round(row["loss_only_ms"] / row["step_ms"], 5)
        low, high = row["step_ratio_iqr"]
        assert low <= row["step_ratio_vs_mnrl"] <= high or name == "mnrl"
    assert results["mnrl"]["step_ratio_iqr"] == [1.0, 1.0] and results["mnrl"]["step_ratio_of_medians"] == 1.0
    assert results["adcse"]["target"] == 1.45 and isinstance(results["adcse"]["meets_target"], bool)
    assert results["adcse"]["meets_target"] == (results["adcse"]["step_ratio_vs_mnrl"] <= 1.45)
    meta = results["_meta"]
    assert meta["smoke"] is True and meta["embedding_dim"] == 32
    assert (meta["model"], meta["group"], meta["seed"], meta["corpus"]) == (
        str(tiny_model_dir), "interleaved", 0, "wiki10k.txt")
    assert (meta["steps_measured"], meta["warmup_steps"], meta["loss_only_reps"], meta["batch_size"],
            meta["torch_threads"]) == (3, 1, 3, 64, 1)
    assert meta["commit"] == provenance()["commit"] and meta["library"] == provenance()["library"]
    assert "| adcse |" in out.with_suffix(".md").read_text()
    assert out.with_suffix(".md").read_text() == overhead.markdown(results)
    assert sorted(p.name for p in work.iterdir()) == ["study.db"]  # the trial writes nothing else
    # again: the record is the finished trial, nothing is measured, the table is the same
    assert runner(str(spec), "--run", "--data-dir", str(shared_data), "--work-dir", str(work), *sets,
                  "--check") == 0
    assert "overhead.md: identical" in capsys.readouterr().out
    assert json.loads(out.read_text()) == results
    # the records file alone, imported into a fresh storage, renders the same table
    assert runner(str(spec), "--check") == 0


@pytest.mark.parametrize(("change", "sets", "message"), [
    ({"methods": ["nope"]}, [], "unknown method(s) nope"),
    ({}, ["--set", "steps=0"], "steps must be an integer >= 1"),
    ({"folder": "corpus/none.txt"}, [], "no corpus at"),
])
def test_bad_input_is_refused_in_one_line_before_any_model_loads(tmp_path, shared_data, capsys, change, sets,
                                                                 message):
    spec = smoke_spec(tmp_path)
    raw = json.loads(spec.read_text())
    if "methods" in change:
        raw["rows"]["interleaved"]["extra"]["methods"] = change["methods"]
    if "folder" in change:
        raw["datasets"]["wiki10k"]["folder"] = change["folder"]
    spec.write_text(json.dumps(raw))
    with pytest.raises(SystemExit) as stop:
        runner(str(spec), "--run", "--data-dir", str(shared_data), "--work-dir", str(tmp_path / "work"), *sets)
    assert stop.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "results").exists()
