"""The checkpoint ledger is input, and checked as input: a name it lists is trusted only as a ``checkpoint-N`` folder
its run wrote (the name pattern, a real folder inside, the record of its files); a checkpoint is removed file by file,
only the files its run wrote and that are unchanged, so a file the user added or changed stays and is named; the
ledger and its temporary file are never written through a link."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from st_hardneg.training.callbacks import CheckpointLedgerCallback
from st_hardneg.training.checkpoints import (
    LEDGER_FILE,
    CheckpointLedger,
    check_checkpoint_folder,
    file_record,
    foreign_entries,
    remove_checkpoint,
    remove_written,
)


def _checkpoint(folder: Path, name: str, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = folder / name / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return folder / name


def _ledger(folder: Path, written: list[str], files: dict[str, dict]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / LEDGER_FILE).write_text(json.dumps({"written": written, "files": files, "created_folder": False}))


def test_the_ledger_records_each_checkpoint_with_its_files(tmp_path):
    folder = tmp_path / "checkpoints"
    _checkpoint(folder, "checkpoint-3", {"model.safetensors": "w" * 10, "1_Pooling/config.json": "{}"})
    ledger = CheckpointLedger(folder)
    ledger.add("checkpoint-3")
    stat = (folder / "checkpoint-3" / "model.safetensors").stat()
    assert ledger.files("checkpoint-3") == {"model.safetensors": [10, stat.st_mtime_ns],
                                            "1_Pooling/config.json": [2, (folder / "checkpoint-3" / "1_Pooling" /
                                                                          "config.json").stat().st_mtime_ns]}
    assert ledger.written() == ["checkpoint-3"] and foreign_entries(folder) == []
    with pytest.raises(ValueError, match="checkpoint-N folders only"):
        ledger.add("notes")


@pytest.mark.parametrize("listed, setup", [
    ("checkpoint-999", "a user's checkpoint, listed by hand without the record of its files"),
    ("../outside", "a name out of the folder"),
    ("notes.txt", "not a checkpoint-N name"),
    ("checkpoint-5", "a symbolic link to a folder outside"),
])
def test_a_name_the_ledgers_run_did_not_write_is_not_trusted(tmp_path, listed, setup):
    outside = tmp_path / "outside"
    _checkpoint(outside, "theirs", {"weights.bin": "precious"})
    folder = tmp_path / "checkpoints"
    _checkpoint(folder, "checkpoint-999", {"weights.bin": "mine"})
    (folder / "notes.txt").write_text("notes")
    (folder / "checkpoint-5").symlink_to(outside / "theirs", target_is_directory=True)
    record = {} if listed == "checkpoint-999" else {listed: {"weights.bin": [8, 1]}}
    _ledger(folder, [listed], record)
    with pytest.warns(UserWarning, match=f"lists '{listed}'.*not trusted"):
        assert CheckpointLedger(folder).written() == []
    with pytest.warns(UserWarning):
        assert remove_written(folder, [listed]) == []
    with pytest.warns(UserWarning):
        assert foreign_entries(folder) == ["checkpoint-5", "checkpoint-999", "notes.txt"]
    assert (outside / "theirs" / "weights.bin").read_text() == "precious"
    assert (folder / "checkpoint-999" / "weights.bin").read_text() == "mine"


def test_a_ledger_that_is_a_link_is_never_read_nor_written(tmp_path):
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    target = tmp_path / "elsewhere.json"
    target.write_text(json.dumps({"written": [], "files": {}}))
    (folder / LEDGER_FILE).symlink_to(target)
    with pytest.raises(ValueError, match="is a symbolic link"):
        CheckpointLedger(folder).add("checkpoint-1")
    assert json.loads(target.read_text()) == {"written": [], "files": {}}


def test_the_ledgers_temporary_file_is_created_exclusively(tmp_path):
    """A link where the earlier ledger wrote its temporary file (``<ledger>.tmp``) is not followed: the temporary
    file has a fresh random name, created with ``O_EXCL``."""
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("untouched")
    (folder / f"{LEDGER_FILE}.tmp").symlink_to(victim)
    ledger = CheckpointLedger(folder)
    ledger.begin()
    _checkpoint(folder, "checkpoint-1", {"a.bin": "x"})
    ledger.add("checkpoint-1")
    assert victim.read_text() == "untouched"
    assert ledger.written() == ["checkpoint-1"]
    assert sorted(os.listdir(folder)) == [LEDGER_FILE, f"{LEDGER_FILE}.tmp", "checkpoint-1"]


def test_a_checkpoint_is_removed_file_by_file_and_what_the_user_added_stays(tmp_path):
    folder = tmp_path / "checkpoints"
    target = _checkpoint(folder, "checkpoint-2", {"model.safetensors": "weights", "1_Pooling/config.json": "{}",
                                                  "optimizer.pt": "state"})
    ledger = CheckpointLedger(folder)
    ledger.add("checkpoint-2")
    (target / "notes.txt").write_text("the user's")  # added after the run wrote the checkpoint
    (target / "optimizer.pt").write_text("changed by the user, longer")  # and one of the run's files changed
    with pytest.warns(UserWarning, match=r"checkpoint-2 is kept: it holds notes.txt, optimizer.pt, which this run "
                                         r"did not write"):
        left = remove_checkpoint(folder, "checkpoint-2", ledger.files("checkpoint-2"), ledger)
    assert left == ["notes.txt", "optimizer.pt"]
    assert sorted(os.listdir(target)) == ["notes.txt", "optimizer.pt"]  # 1_Pooling/ went once empty
    assert (target / "notes.txt").read_text() == "the user's"
    # the ledger no longer lists it: what stays is not st-hardneg's
    assert ledger.written() == [] and foreign_entries(folder) == ["checkpoint-2"]


def test_removal_never_follows_a_link_inside_a_checkpoint(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.bin").write_text("outside")
    folder = tmp_path / "checkpoints"
    target = _checkpoint(folder, "checkpoint-1", {"sub/a.bin": "aa"})
    record = file_record(target)
    (target / "sub" / "a.bin").unlink()
    (target / "sub").rmdir()
    (target / "sub").symlink_to(outside, target_is_directory=True)  # the folder swapped for a link
    (outside / "a.bin").write_text("aa")
    with pytest.warns(UserWarning, match="is kept: it holds sub"):
        assert remove_checkpoint(folder, "checkpoint-1", record) == ["sub"]
    assert sorted(os.listdir(outside)) == ["a.bin", "keep.bin"]


def test_rotation_keeps_a_users_file_and_names_it(tmp_path):
    """The callback alone (no Trainer): a save into an earlier run's checkpoint records only what it wrote, and its
    rotation removes exactly that."""
    folder = tmp_path / "checkpoints"
    args = SimpleNamespace(output_dir=str(folder), save_strategy="steps")
    callback = CheckpointLedgerCallback(save_total_limit=1)
    state = SimpleNamespace(is_world_process_zero=True, global_step=0, best_model_checkpoint=None)
    control = SimpleNamespace(should_save=True)
    callback.on_train_begin(args, state, control)
    for step in (1, 2):
        state.global_step = step
        if step == 1:  # an earlier checkpoint-1 holding a user's file: this run saves into it
            _checkpoint(folder, "checkpoint-1", {"model.bin": "old"})
            CheckpointLedger(folder).add("checkpoint-1")
            (folder / "checkpoint-1" / "notes.txt").write_text("the user's")
        callback.on_step_end(args, state, control)
        _checkpoint(folder, f"checkpoint-{step}", {"model.bin": f"weights of step {step}", "trainer_state.json": "{}"})
        if step == 2:
            with pytest.warns(UserWarning, match=r"checkpoint-1 is kept: it holds notes.txt"):
                callback.on_save(args, state, control)
        else:
            callback.on_save(args, state, control)
    assert callback.files["checkpoint-2"].keys() == {"model.bin", "trainer_state.json"}
    assert sorted(os.listdir(folder / "checkpoint-1")) == ["notes.txt"]
    assert CheckpointLedger(folder).written() == ["checkpoint-2"]


def test_a_crashed_runs_checkpoints_are_refused_without_overwrite_or_resume(tmp_path):
    folder = tmp_path / "checkpoints"
    for step in (1, 2):
        _checkpoint(folder, f"checkpoint-{step}", {"model.bin": str(step)})
        CheckpointLedger(folder).add(f"checkpoint-{step}")
    check_checkpoint_folder(folder, False)  # leftovers are the later check's (the resume is known then)
    with pytest.raises(ValueError, match=r"holds checkpoint-1, checkpoint-2, left by an earlier st-hardneg run .*"
                                         r"resume_from_checkpoint=last to continue that run, or --overwrite"):
        check_checkpoint_folder(folder, False, leftovers=True)
    check_checkpoint_folder(folder, True, leftovers=True)
    check_checkpoint_folder(folder, False, leftovers=True, resume=str(folder / "checkpoint-2"))
    with pytest.raises(ValueError, match=r"holds checkpoint-2, saved by an earlier st-hardneg run after step 1"):
        check_checkpoint_folder(folder, False, leftovers=True, resume=str(folder / "checkpoint-1"))
