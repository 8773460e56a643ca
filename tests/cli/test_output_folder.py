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


# --------------------------------------------------------------------------- a user's files, a crashed run, two runs
def _quiet_off(argv: list[str]) -> list[str]:
    """``argv`` without ``-q``: warnings are printed (``-q`` silences them)."""
    return [item for item in argv if item != "-q"]


def test_a_users_file_in_an_earlier_checkpoint_survives_rotation_and_is_named(data, tmp_path, capsys):
    out = tmp_path / "out"
    assert cli.main(_argv(data, out, *SAVE)) == 0
    (out / "checkpoints" / "checkpoint-1" / "notes.txt").write_text("the user's")
    # the next run saves into checkpoint-1 again and rotates it away: only the files it wrote go
    capsys.readouterr()
    assert cli.main(_quiet_off(_argv(data, out, "--overwrite", *SAVE, "--training-arg", "save_total_limit=1"))) == 0
    err = capsys.readouterr().err
    assert "checkpoint-1 is kept: it holds notes.txt, which this run did not write" in err
    assert sorted(os.listdir(out / "checkpoints" / "checkpoint-1")) == ["notes.txt"]
    assert (out / "checkpoints" / "checkpoint-1" / "notes.txt").read_text() == "the user's"
    assert not (out / "checkpoints" / "checkpoint-2").exists()
    assert CheckpointLedger(out / "checkpoints").written() == ["checkpoint-3"]
    assert foreign_entries(out / "checkpoints") == ["checkpoint-1"]


@pytest.mark.parametrize("name", ["training_curve.png", "final"])
def test_a_users_output_file_is_refused_without_overwrite(data, tmp_path, capsys, name):
    out = tmp_path / "out"
    out.mkdir()
    if name == "final":
        (out / name).mkdir()
    else:
        (out / name).write_bytes(b"my own figure")
    assert cli.main(_argv(data, out, "--training-arg", "logging_steps=1")) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and name in err and "--overwrite" in err
    assert sorted(os.listdir(out)) == [name]
    if name != "final":
        assert (out / name).read_bytes() == b"my own figure"


class _Crash(RuntimeError):
    pass


def _crash_after(monkeypatch, step: int) -> None:
    """The next run crashes when it begins the step after ``step`` (its checkpoint of ``step`` saved)."""
    from transformers import TrainerCallback

    from st_hardneg.cli import train as train_cli

    class Crash(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step == step:
                raise _Crash(f"killed after step {step}")

    original = train_cli.run_callbacks
    monkeypatch.setattr(train_cli, "run_callbacks", lambda *a: [*original(*a), Crash()])


def _fingerprints(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(folder.rglob("*"))
            if p.is_file()}


def test_a_crashed_runs_checkpoints_are_not_rewritten_by_a_fresh_run(data, tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    argv = _argv(data, out, "--training-arg", "save_strategy=steps", "--training-arg", "save_steps=2",
                 "--max-steps", "5")
    with monkeypatch.context() as patch:
        _crash_after(patch, 2)
        assert cli.main(argv) == 1  # a failure at run time
    assert "killed after step 2" in capsys.readouterr().err
    assert sorted(os.listdir(out / "checkpoints")) == [LEDGER_FILE, "checkpoint-2"]
    before = _fingerprints(out / "checkpoints")
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "holds checkpoint-2, left by an earlier st-hardneg run of this folder that did not finish" in err
    assert "resume_from_checkpoint=last" in err and "--overwrite" in err
    assert _fingerprints(out / "checkpoints") == before and sorted(os.listdir(out)) == ["checkpoints"]
    # resuming continues the crashed run, and leaves its checkpoint as it was
    assert cli.main([*argv, "--training-arg", "resume_from_checkpoint=last"]) == 0
    assert json.loads((out / "results.json").read_text())["steps"] == 5
    assert {k: v for k, v in _fingerprints(out / "checkpoints").items() if k.startswith("checkpoint-2")} == \
        {k: v for k, v in before.items() if k.startswith("checkpoint-2")}
    assert CheckpointLedger(out / "checkpoints").written() == ["checkpoint-2", "checkpoint-4", "checkpoint-5"]


@pytest.mark.parametrize("command", ["train", "eval"])
def test_a_folder_in_use_refuses_a_second_run(data, tmp_path, capsys, command):
    """A second process holds the folder (as a running ``train`` or ``eval`` does): this run is refused at once,
    naming the holder's pid, and writes nothing; once the holder dies (killed, no clean-up of its own), the folder is
    free."""
    import signal
    import subprocess
    import sys

    from st_hardneg.testing.beir import make_tiny_beir

    out = tmp_path / "out"
    argv = _argv(data, out) if command == "train" else [
        "eval", "--model", str(data["model"]), "--tasks", "beir", "--data", str(make_tiny_beir(tmp_path / "tiny")),
        "--output-dir", str(out), "--quiet"]
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom st_hardneg.cli.paths import output_lock\n"
         f"with output_lock({str(out)!r}):\n    print('held', flush=True)\n    time.sleep(120)\n"],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(Path(cli.__file__).parents[2])})
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        assert cli.main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and f"the folder is in use by pid {holder.pid}" in err
        assert sorted(os.listdir(out)) == [".st-hardneg.lock"]
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(30)
    assert cli.main(argv) == 0  # the kernel released the dead holder's lock
    written = out / "results.json" if command == "train" else next(out.glob("st-hardneg/*/*/eval.json"))
    assert written.is_file() and not (out / ".st-hardneg.lock").exists()


def test_the_curve_is_drawn_from_two_points_and_fewer_are_a_warning(data, tmp_path, capsys):
    from PIL import Image

    out = tmp_path / "two"
    assert cli.main(_argv(data, out, "--training-arg", "logging_steps=2", "--max-steps", "4")) == 0
    assert json.loads((out / "results.json").read_text())["training_curve"] == "training_curve.png"
    with Image.open(out / "training_curve.png") as image:
        assert image.format == "PNG"
    capsys.readouterr()
    one = tmp_path / "one"
    assert cli.main(_quiet_off(_argv(data, one, "--training-arg", "logging_steps=2"))) == 0  # 3 steps: 1 point
    err = capsys.readouterr().err
    assert "warning: no training curve: the run logged its loss at 1 step(s), and a curve needs 2" in err
    assert json.loads((one / "results.json").read_text())["training_curve"] is None
    assert not (one / "training_curve.png").exists()


@pytest.mark.integration
def test_resume_after_a_crash_of_an_sts_run(tiny_model_dir, tiny_sentences, shared_data, tmp_path, monkeypatch,
                                            capsys):
    """``--task sts`` evaluates on STS-B dev, and the Trainer makes ``checkpoints/eval/`` for it: the run's own, so
    ``resume_from_checkpoint=last`` after a crash resumes (before: refused, ``eval`` named as a user's entry)."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(f"{sentence} ({copy})" for copy in range(3) for sentence in tiny_sentences) + "\n")
    out = tmp_path / "sts"
    argv = ["train", "--model", str(tiny_model_dir), "--corpus", str(corpus), "--data-dir", str(shared_data),
            "--batch-size", "8", "--eval-steps", "2", "--max-steps", "6", "--output-dir", str(out), "-q"]
    with monkeypatch.context() as patch:
        _crash_after(patch, 4)
        assert cli.main(argv) == 1
    assert sorted(os.listdir(out / "checkpoints")) == [LEDGER_FILE, "checkpoint-2", "checkpoint-4", "eval"]
    assert foreign_entries(out / "checkpoints") == []
    capsys.readouterr()
    assert cli.main(argv) == 2
    assert "left by an earlier st-hardneg run" in capsys.readouterr().err
    assert cli.main([*argv, "--training-arg", "resume_from_checkpoint=last"]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["steps"] == 6 and results["stsb_dev_best"] is not None
    state = json.loads((out / "checkpoints" / "checkpoint-6" / "trainer_state.json").read_text())
    assert [row["step"] for row in state["log_history"] if "eval_sts-dev_spearman" in row] == [2, 4, 6]
