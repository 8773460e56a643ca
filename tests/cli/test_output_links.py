"""No path out of the output folder: for every file or folder ``train`` and ``eval`` write (or remove), a symbolic link
there to a place outside the output folder, or a dangling one, is refused in one line naming it (exit 2), and
nothing outside the folder is written or removed, ``--overwrite`` or not."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from st_hardneg import cli
from st_hardneg.testing.beir import make_tiny_beir
from st_hardneg.training.checkpoints import LEDGER_FILE, CheckpointLedger

SAVE = ["--training-arg", "save_strategy=steps", "--training-arg", "save_steps=1"]


def _argv(data: dict[str, Path], out: Path, *extra: str) -> list[str]:
    return ["train", "--task", "retrieval", "--model", str(data["model"]), "--data-dir", str(data["data"]),
            "--train-file", str(data["own"]), "--output-dir", str(out), "--no-sts", "-q", "--batch-size", "8",
            "--max-steps", "3", *extra]


def _tree(folder: Path) -> dict[str, str]:
    """Every entry under ``folder`` with its content's digest (folders and links by kind): what must not change."""
    found = {}
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder).as_posix()
        if path.is_symlink():
            found[rel] = f"link to {os.readlink(path)}"
        elif path.is_dir():
            found[rel] = "folder"
        else:
            found[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


@pytest.fixture
def outside(tmp_path) -> Path:
    """A folder outside every output folder, holding a file and a folder a link may point at."""
    folder = tmp_path / "outside"
    (folder / "dir").mkdir(parents=True)
    (folder / "file").write_text("the user's file outside the output folder")
    (folder / "dir" / "inner.txt").write_text("kept")
    return folder


def _link(path: Path, target: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(target, target_is_directory=target.is_dir())
    return path


def _earlier_checkpoint(out: Path, name: str = "checkpoint-2") -> Path:
    """A checkpoint an earlier st-hardneg run of ``out`` wrote (recorded in the ledger with its files)."""
    folder = out / "checkpoints" / name
    folder.mkdir(parents=True)
    (folder / "trainer_state.json").write_text("{}")
    CheckpointLedger(out / "checkpoints").add(name)
    return folder


#: every place ``train --task retrieval`` writes: (what, how the link is laid, is the target a folder)
TRAIN_PLACES = {
    "results.json": lambda out, o: _link(out / "results.json", o / "file"),
    "results.json (dangling)": lambda out, o: _link(out / "results.json", o / "missing.json"),
    "training_curve.png": lambda out, o: _link(out / "training_curve.png", o / "file"),
    "training_curve.png (dangling)": lambda out, o: _link(out / "training_curve.png", o / "missing.png"),
    "final": lambda out, o: _link(out / "final", o / "dir"),
    "final/model.safetensors": lambda out, o: _link(out / "final" / "model.safetensors", o / "file"),
    "checkpoints": lambda out, o: _link(out / "checkpoints", o / "dir"),
    "checkpoints/checkpoint-2": lambda out, o: _link(out / "checkpoints" / "checkpoint-2", o / "dir"),
    "checkpoints/checkpoint-2/optimizer.pt": lambda out, o: _link(_earlier_checkpoint(out) / "optimizer.pt",
                                                                   o / "file"),
    "checkpoints/ledger": lambda out, o: _link(out / "checkpoints" / LEDGER_FILE, o / "file"),
    "checkpoints/eval": lambda out, o: _link(out / "checkpoints" / "eval", o / "dir"),
    "the lock file": lambda out, o: _link(out / ".st-hardneg.lock", o / "file"),
}


@pytest.mark.parametrize("place", list(TRAIN_PLACES))
def test_train_never_writes_through_a_link_out_of_its_folder(data, tmp_path, outside, place, capsys):
    out = tmp_path / "out"
    out.mkdir()
    link = TRAIN_PLACES[place](out, outside)
    before_outside, before_out = _tree(outside), _tree(out)
    assert cli.main(_argv(data, out, "--overwrite", *SAVE)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "symbolic link" in err and link.name in err, err
    assert _tree(outside) == before_outside  # nothing written or removed outside
    assert _tree(out) == before_out  # and the run wrote nothing: refused before it started
    assert link.is_symlink()


@pytest.mark.parametrize("name", ["per_query.tsv", "tiny-test.trec"])
@pytest.mark.parametrize("dangling", [False, True], ids=["to-a-file", "dangling"])
def test_train_beir_never_writes_its_retrieval_files_through_a_link(data, tmp_path, outside, name, dangling, capsys):
    beir = make_tiny_beir(tmp_path / "tiny")
    out = tmp_path / "out"
    link = _link(out / name, outside / ("missing" if dangling else "file"))
    before = _tree(outside)
    argv = ["train", "--task", "beir", "--data", str(beir), "--model", str(data["model"]), "--output-dir", str(out),
            "-q", "--batch-size", "8", "--max-steps", "2", "--overwrite"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "symbolic link" in err and str(link) in err, err
    assert _tree(outside) == before and sorted(os.listdir(out)) == [name]


@pytest.mark.parametrize("side", ["per_query.tsv", "tiny-test.trec", "json"])
def test_eval_never_writes_through_a_link_out_of_its_folder(data, tmp_path, outside, side, capsys):
    beir = make_tiny_beir(tmp_path / "tiny")
    out = tmp_path / "out"
    results = out / "r.json"
    link = _link(results if side == "json" else out / f"r.{side}", outside / "file")
    before = _tree(outside)
    argv = ["eval", "--model", str(data["model"]), "--tasks", "beir", "--data", str(beir), "--output", str(results),
            "--quiet", "--overwrite"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "symbolic link" in err and str(link) in err, err
    assert _tree(outside) == before and link.is_symlink()


def test_a_link_inside_the_folder_to_a_place_inside_is_replaced_not_followed(data, tmp_path):
    """A link whose target is inside the output folder is not a way out: the run writes its own file in its place
    (atomically, a temporary file renamed over the link), and the file the link pointed at is untouched."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    (out / "training_curve.png").symlink_to(out / "notes.txt")
    assert cli.main(_argv(data, out, "--overwrite", "--training-arg", "logging_steps=1")) == 0
    assert (out / "notes.txt").read_text() == "mine"
    assert not (out / "training_curve.png").is_symlink()
    assert (out / "training_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
