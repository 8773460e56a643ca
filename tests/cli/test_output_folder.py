"""The output folder is the user's: a run removes only the checkpoints it wrote (tracked by name in the folder's
ledger), a checkpoint folder holding what no st-hardneg run wrote is refused without ``--overwrite`` and left
untouched with it, rotation never reaches a folder the run did not write — under ``--output-dir .``, through a
symbolic link, on resume."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from st_hardneg import cli
from st_hardneg.training.checkpoints import LEDGER_FILE, CheckpointLedger, foreign_entries, remove_written


def _argv(data: dict[str, Path], out: Path | str, *extra: str) -> list[str]:
    return ["train", "--task", "retrieval", "--model", str(data["model"]), "--data-dir", str(data["data"]),
            "--train-file", str(data["own"]), "--output-dir", str(out), "--no-sts", "-q", "--batch-size", "8",
            "--max-steps", "3", *extra]


def _user_files(checkpoints: Path) -> dict[str, str]:
    """A user's own files in ``checkpoints/``: a note and a checkpoint-like folder no st-hardneg run wrote."""
    checkpoints.mkdir(parents=True, exist_ok=True)
    (checkpoints / "notes.txt").write_text("my notes")
    (checkpoints / "checkpoint-999").mkdir()
    (checkpoints / "checkpoint-999" / "weights.bin").write_text("my weights")
    return {"notes.txt": "my notes", "checkpoint-999/weights.bin": "my weights"}


def _unchanged(checkpoints: Path, files: dict[str, str]) -> bool:
    return all((checkpoints / name).read_text() == text for name, text in files.items())


SAVE = ["--training-arg", "save_strategy=steps", "--training-arg", "save_steps=1"]


def test_a_checkpoint_folder_with_user_files_is_refused_without_overwrite(data, tmp_path, capsys):
    out = tmp_path / "out"
    files = _user_files(out / "checkpoints")
    assert cli.main(_argv(data, out)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "checkpoint-999, notes.txt" in err and "--overwrite" in err
    assert _unchanged(out / "checkpoints", files) and sorted(os.listdir(out)) == ["checkpoints"]


@pytest.mark.parametrize("save", [[], SAVE], ids=["no-checkpoints", "checkpoints-kept"])
def test_with_overwrite_the_users_files_stay_and_the_run_removes_only_its_own(data, tmp_path, save):
    out = tmp_path / "out"
    files = _user_files(out / "checkpoints")
    assert cli.main(_argv(data, out, "--overwrite", *save)) == 0
    assert _unchanged(out / "checkpoints", files)
    kept = set(os.listdir(out / "checkpoints")) - {"notes.txt", "checkpoint-999"}
    # without save_strategy the run's checkpoints (none here) are removed; with it, its three are kept and listed
    assert kept == ({"checkpoint-1", "checkpoint-2", "checkpoint-3", LEDGER_FILE} if save else set())
    if save:
        assert CheckpointLedger(out / "checkpoints").written() == ["checkpoint-1", "checkpoint-2", "checkpoint-3"]
        assert foreign_entries(out / "checkpoints") == ["checkpoint-999", "notes.txt"]


def test_an_output_dir_of_dot_keeps_a_projects_checkpoints(data, tmp_path, monkeypatch, capsys):
    project = tmp_path / "project"
    (project / "checkpoints" / "my-best-model").mkdir(parents=True)
    (project / "checkpoints" / "my-best-model" / "model.safetensors").write_text("precious")
    monkeypatch.chdir(project)
    assert cli.main(_argv(data, ".")) == 2
    assert "my-best-model" in capsys.readouterr().err
    assert cli.main(_argv(data, ".", "--overwrite")) == 0
    assert (project / "checkpoints" / "my-best-model" / "model.safetensors").read_text() == "precious"
    assert (project / "final" / "modules.json").is_file()


def test_a_symlinked_output_folder_keeps_its_targets_files(data, tmp_path):
    target = tmp_path / "target"
    files = _user_files(target / "checkpoints")
    link = tmp_path / "link"
    link.symlink_to(target, target_is_directory=True)
    assert cli.main(_argv(data, link, "--overwrite")) == 0
    assert _unchanged(target / "checkpoints", files) and link.is_symlink()
    assert (target / "final" / "modules.json").is_file()


def test_rotation_never_reaches_a_folder_the_run_did_not_write(data, tmp_path):
    """``save_total_limit=1`` keeps the newest of the run's own checkpoints; a user's ``checkpoint-0`` stays
    (transformers' rotation would delete it: it sorts first)."""
    out = tmp_path / "out"
    (out / "checkpoints" / "checkpoint-0").mkdir(parents=True)
    (out / "checkpoints" / "checkpoint-0" / "mine.txt").write_text("user")
    assert cli.main(_argv(data, out, "--overwrite", *SAVE, "--training-arg", "save_total_limit=1")) == 0
    assert sorted(os.listdir(out / "checkpoints")) == [LEDGER_FILE, "checkpoint-0", "checkpoint-3"]
    assert (out / "checkpoints" / "checkpoint-0" / "mine.txt").read_text() == "user"
    assert CheckpointLedger(out / "checkpoints").written() == ["checkpoint-3"]


def test_a_foreign_checkpoint_the_run_would_save_into_is_refused_even_with_overwrite(data, tmp_path, capsys):
    out = tmp_path / "out"
    (out / "checkpoints" / "checkpoint-2").mkdir(parents=True)
    assert cli.main(_argv(data, out, "--overwrite", *SAVE)) == 2
    err = capsys.readouterr().err
    assert "checkpoint-2" in err and "3 steps" in err
    assert sorted(os.listdir(out / "checkpoints")) == ["checkpoint-2"]


def test_a_foreign_final_folder_is_refused_without_overwrite(data, tmp_path, capsys):
    out = tmp_path / "out"
    (out / "final").mkdir(parents=True)
    (out / "final" / "my-model.txt").write_text("mine")
    assert cli.main(_argv(data, out)) == 2
    assert "final/" in capsys.readouterr().err
    assert sorted(os.listdir(out / "final")) == ["my-model.txt"]


def test_resume_with_overwrite_keeps_the_checkpoints_it_resumed_from(data, tmp_path):
    """An earlier run's checkpoints are not this run's: resuming from them and finishing leaves them in place, and
    the ledger still names them."""
    out = tmp_path / "out"
    assert cli.main(_argv(data, out, *SAVE, "--stop-after", "2")) == 0
    before = sorted(os.listdir(out / "checkpoints"))
    assert before == [LEDGER_FILE, "checkpoint-1", "checkpoint-2"]
    assert cli.main(_argv(data, out, "--overwrite", "--training-arg", "resume_from_checkpoint=last")) == 0
    assert sorted(os.listdir(out / "checkpoints")) == before
    assert json.loads((out / "results.json").read_text())["steps"] == 3
    assert CheckpointLedger(out / "checkpoints").written() == ["checkpoint-1", "checkpoint-2"]
    assert foreign_entries(out / "checkpoints") == []


def test_remove_written_removes_only_listed_checkpoint_folders(tmp_path):
    folder = tmp_path / "checkpoints"
    ledger = CheckpointLedger(folder)
    ledger.begin()
    for name in ("checkpoint-1", "checkpoint-2", "notes", "checkpoint-7"):
        (folder / name).mkdir(parents=True)
    ledger.add("checkpoint-1")
    ledger.add("checkpoint-2")
    # checkpoint-7 and notes were never listed: asked to remove them, remove_written refuses silently by design
    assert remove_written(folder, ["checkpoint-1", "checkpoint-7", "notes"]) == ["checkpoint-1"]
    assert sorted(os.listdir(folder)) == [LEDGER_FILE, "checkpoint-2", "checkpoint-7", "notes"]
    assert remove_written(folder, ["checkpoint-2"]) == ["checkpoint-2"]
    # the ledger is gone once empty; the folder stays, since it holds what st-hardneg did not write
    assert sorted(os.listdir(folder)) == ["checkpoint-7", "notes"]


def test_a_folder_the_ledger_created_goes_once_empty_but_never_a_symlink(tmp_path):
    folder = tmp_path / "made"
    ledger = CheckpointLedger(folder)
    ledger.begin()
    (folder / "checkpoint-1").mkdir()
    ledger.add("checkpoint-1")
    remove_written(folder, ["checkpoint-1"])
    assert not folder.exists()
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real, target_is_directory=True)
    CheckpointLedger(link).begin()
    (link / "checkpoint-1").mkdir()
    CheckpointLedger(link).add("checkpoint-1")
    remove_written(link, ["checkpoint-1"])
    assert link.is_symlink() and real.is_dir()


def test_a_damaged_ledger_is_named(tmp_path):
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    (folder / LEDGER_FILE).write_text("{not json")
    with pytest.raises(ValueError, match=r"is damaged .*remove it only if"):
        foreign_entries(folder)


def test_train_draws_its_curve_beside_the_results(data, tmp_path):
    from PIL import Image

    out = tmp_path / "out"
    assert cli.main(_argv(data, out, "--training-arg", "logging_steps=1")) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["training_curve"] == "training_curve.png"
    with Image.open(out / "training_curve.png") as image:
        assert image.format == "PNG"
    # a run that logged no step (3 steps, the recipe's logging every 10) draws nothing and says so in the results
    assert cli.main(_argv(data, tmp_path / "short")) == 0
    assert json.loads((tmp_path / "short" / "results.json").read_text())["training_curve"] is None
    assert not (tmp_path / "short" / "training_curve.png").exists()
