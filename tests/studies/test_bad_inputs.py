"""``st-hardneg study``'s bad inputs: one line naming the value, exit 2, before any model loads, and nothing written
outside (or, where the check comes first, inside) the output folder."""

from __future__ import annotations

import json
import shutil

import pytest

from st_hardneg import cli

pytest.importorskip("optuna")


@pytest.fixture
def no_model(monkeypatch):
    """Any model load fails the test: a usage error must come first."""
    from st_hardneg import models

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the usage error")

    for name in ("load_model", "load_checkpoint", "training_model", "load_default_model"):
        monkeypatch.setattr(models, name, refuse)


@pytest.fixture(scope="module")
def beir(tmp_path_factory):
    from st_hardneg.testing.beir import make_tiny_beir

    return make_tiny_beir(tmp_path_factory.mktemp("bad") / "tiny")


def _one_line_exit_2(argv, capsys) -> str:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def _study(beir, out, *extra):
    return ["study", "--data", str(beir), "--method", "mnrl=mnrl", "--output-dir", str(out), *extra]


@pytest.mark.parametrize("extra, fragment", [
    (["--method", "x=nosuchloss"], "row 'x': unknown loss 'nosuchloss'; choose from"),
    (["--method", "f=focal:temprature=0.1"], "row 'f': loss 'focal' takes no argument temprature (did you mean "
                                             "temperature?)"),
    (["--method", "m=mixcse:lam=3"], "row 'm': loss 'mixcse': lam"),
    (["--method", "g=gist:margn=0.1"], "row 'g': loss 'gist' takes no argument margn"),
    (["--method", "c=mnrl:control=true"], "the false-negative control needs a loss that takes a guide"),
    (["--method", "nolossgiven="], "--method expects LABEL=LOSS"),
    (["--method", "mnrl=focal"], "the label 'mnrl' is given twice"),
    (["--seeds", "-1"], "seed must be a non-negative integer, got -1"),
    (["--seeds", str(2**32)], f"seed must be at most {2**32 - 1}"),
    (["--seeds", "0", "0"], "--seeds gives a seed twice"),
    (["--workers", "0"], "--workers must be an integer >= 1, got 0"),
    (["--workers", "10000"], "--workers 10000 is more than this machine's"),
    (["--storage", "nosuchdialect://x"], "the storage nosuchdialect://x cannot be opened"),
    (["--storage", "sqlite:////no/such/folder/study.db"], "the storage sqlite:////no/such/folder/study.db cannot be "
                                                          "opened"),
    (["--baseline", "other"], "the baseline 'other' is not a row of the study"),
    (["--limit", "2", "--batch-size", "4"], "--limit 2 is fewer training pairs than one batch (4)"),
])
def test_a_bad_option_is_one_line_exit_2_before_any_model(no_model, beir, tmp_path, capsys, extra, fragment):
    err = _one_line_exit_2(_study(beir, tmp_path / "out", *extra), capsys)
    assert err.startswith("st-hardneg study: error: ") and fragment in err, err
    assert not (tmp_path / "out").exists()  # refused before anything was written


@pytest.mark.parametrize("remove, split", [("test.tsv", "test"), ("train.tsv", "train")])
def test_a_folder_without_a_split_the_study_needs_is_named(no_model, beir, tmp_path, capsys, remove, split):
    folder = tmp_path / "partial"
    shutil.copytree(beir, folder)
    (folder / "qrels" / remove).unlink()
    err = _one_line_exit_2(_study(folder, tmp_path / "out"), capsys)
    assert f"the BEIR folder {folder} has no qrels/{split}.tsv" in err
    assert not (tmp_path / "out").exists()


def test_a_spec_asking_for_dev_qrels_of_a_folder_without_them_is_named(no_model, beir, tmp_path, capsys):
    spec = {"name": "s", "rows": {"mnrl": {"loss": "mnrl"}},
            "datasets": {"tiny": {"folder": str(beir), "dev": "qrels"}},
            "grid": [{"datasets": ["tiny"], "rows": ["mnrl"], "seeds": [0]}]}
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    err = _one_line_exit_2(["study", "--spec", str(path), "--output-dir", str(tmp_path / "out")], capsys)
    assert "has no qrels/dev.tsv, which the study needs (dev split)" in err


@pytest.mark.parametrize("change, fragment", [
    ({"rows": {"mnrl": {"loss": "mnrl", "options": {"scale": 3}}}}, "row 'mnrl': loss 'mnrl' takes no argument scale"),
    ({"grid": [{"datasets": ["tiny"], "rows": ["other"], "seeds": [0]}]}, "the grid names row 'other'"),
    ({"grid": [{"datasets": ["elsewhere"], "rows": ["mnrl"], "seeds": [0]}]}, "the grid names dataset 'elsewhere'"),
    ({"grid": [{"datasets": ["tiny"], "rows": ["mnrl"], "seeds": [1.5]}]}, "seed must be a non-negative integer, got 1.5"),
    ({"choice": {"metric": "map"}}, "the choice metric must be one of"),
    ({"colour": "blue"}, "unknown field(s) colour"),
])
def test_a_bad_spec_names_the_file_and_the_value(no_model, beir, tmp_path, capsys, change, fragment):
    spec = {"name": "s", "rows": {"mnrl": {"loss": "mnrl"}}, "datasets": {"tiny": {"folder": str(beir)}},
            "grid": [{"datasets": ["tiny"], "rows": ["mnrl"], "seeds": [0]}], **change}
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    err = _one_line_exit_2(["study", "--spec", str(path), "--output-dir", str(tmp_path / "out")], capsys)
    assert f"the study spec {path}: " in err and fragment in err, err


def test_a_study_resumed_with_another_spec_is_refused(no_model, beir, tmp_path, capsys):
    from st_hardneg.training.studies.engine import open_storage, open_study
    from st_hardneg.training.studies.spec import Dataset, spec_from_methods

    out = tmp_path / "out"
    out.mkdir()
    first = spec_from_methods(["mnrl=mnrl"], datasets={"tiny": Dataset(folder=str(beir.resolve()))}, seeds=[0],
                              protocol={"limit": 0, "max_steps": -1})
    open_study(first, open_storage(f"sqlite:///{out / 'study.db'}"))
    err = _one_line_exit_2(["study", "--data", str(beir), "--method", "mnrl=mnrl", "--seeds", "0", "1",
                            "--output-dir", str(out)], capsys)
    assert "the study 'study' in this storage was made from another spec (changed: grid)" in err


@pytest.mark.parametrize("trial, fragment", [
    (None, "'mnrl' carries settings of a benchmark's own trials (extra), and the spec names no trial function"),
    ("tests.studies.trials:slow_trial", "the module tests.studies.trials has no function 'slow_trial'"),
])
def test_a_spec_with_its_own_trials_needs_an_importable_trial_function(no_model, beir, tmp_path, capsys, trial,
                                                                       fragment):
    spec = {"name": "s", "rows": {"mnrl": {"loss": "mnrl", "extra": {"mining": "own"}}},
            "datasets": {"tiny": {"folder": str(beir)}},
            "grid": [{"datasets": ["tiny"], "rows": ["mnrl"], "seeds": [0]}], **({"trial": trial} if trial else {})}
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    err = _one_line_exit_2(["study", "--spec", str(path), "--output-dir", str(tmp_path / "out")], capsys)
    assert fragment in err, err
    assert not (tmp_path / "out").exists()  # refused before anything is written
