"""The output-folder guard (``st_hardneg.reporting``) every written or removed file of a run goes through, and the
folder lock of ``st_hardneg.cli.paths``: a link out of the folder or a dangling one is refused by name, a link inside
is replaced and never followed, temporary files are exclusive, and a folder is held by one process at a time."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from st_hardneg.cli.paths import LOCK_FILE, FolderInUseError, output_lock
from st_hardneg.evaluation.runs import read_per_query, read_trec_run, write_per_query, write_trec_run
from st_hardneg.plots import plot_run_curve
from st_hardneg.reporting import (
    OutsideOutputFolderError,
    atomic_write,
    check_output_path,
    check_output_tree,
    remove_output_file,
    write_json,
)

RUN = {"q1": {"d1": 0.5, "d2": 0.25}}
PER_QUERY = {"task": {"q1": {"ndcg@10": 50.0, "mrr@10": 100.0, "recall@10": 100.0, "recall@100": 100.0, "map@100": 75.0}}}
HISTORY = [{"step": 1, "loss": 2.0}, {"step": 2, "loss": 1.5}]


@pytest.fixture
def folders(tmp_path) -> tuple[Path, Path]:
    out, outside = tmp_path / "out", tmp_path / "outside"
    out.mkdir()
    outside.mkdir()
    (outside / "theirs.txt").write_text("theirs")
    return out, outside


#: every writer of a run's files, each writing ``path`` inside ``out``
WRITERS = {
    "write_json": lambda path, out: write_json(path, {"a": 1}, out),
    "write_trec_run": lambda path, out: write_trec_run(path, RUN, inside=out),
    "write_per_query": lambda path, out: write_per_query(path, PER_QUERY, inside=out),
    "plot_run_curve": lambda path, out: plot_run_curve(HISTORY, path.with_suffix(".png"), inside=out),
}


@pytest.mark.parametrize("writer", list(WRITERS))
@pytest.mark.parametrize("dangling", [False, True], ids=["to-a-file", "dangling"])
def test_no_writer_follows_a_link_out_of_the_folder(folders, writer, dangling):
    out, outside = folders
    path = out / "result.png" if writer == "plot_run_curve" else out / "result.txt"
    path.symlink_to(outside / ("missing" if dangling else "theirs.txt"))
    with pytest.raises(OutsideOutputFolderError, match="dangling symbolic link" if dangling else
                       "is a symbolic link to .*outside the output folder") as error:
        WRITERS[writer](path.with_suffix(".txt") if writer == "plot_run_curve" else path, out)
    assert str(path) in str(error.value)
    assert sorted(os.listdir(outside)) == ["theirs.txt"] and (outside / "theirs.txt").read_text() == "theirs"
    assert sorted(os.listdir(out)) == [path.name] and path.is_symlink()  # no temporary file left either


@pytest.mark.parametrize("writer", list(WRITERS))
def test_a_parent_folder_that_links_out_is_refused(folders, writer):
    out, outside = folders
    (out / "sub").symlink_to(outside, target_is_directory=True)
    with pytest.raises(OutsideOutputFolderError, match="outside the output folder"):
        WRITERS[writer](out / "sub" / "result.txt", out)
    assert sorted(os.listdir(outside)) == ["theirs.txt"]


def test_writers_read_back_what_they_wrote_and_replace_a_link_inside(folders):
    out, _ = folders
    (out / "mine.txt").write_text("mine")
    for name in ("run.trec", "per_query.tsv"):
        (out / name).symlink_to(out / "mine.txt")
    assert read_trec_run(write_trec_run(out / "run.trec", RUN, inside=out)) == RUN
    assert read_per_query(write_per_query(out / "per_query.tsv", PER_QUERY, inside=out)) == PER_QUERY
    assert (out / "mine.txt").read_text() == "mine"
    assert not (out / "run.trec").is_symlink() and not (out / "per_query.tsv").is_symlink()
    assert sorted(os.listdir(out)) == ["mine.txt", "per_query.tsv", "run.trec"]


def test_a_temporary_file_is_never_an_existing_name(folders, monkeypatch):
    """The temporary file is made by ``mkstemp`` (``O_CREAT | O_EXCL``, a random name) in the target's folder: a
    link laid at the old fixed name ``results.json.tmp`` is neither followed nor removed."""
    out, outside = folders
    (out / "results.json.tmp").symlink_to(outside / "theirs.txt")
    write_json(out / "results.json", {"a": 1}, out)
    assert json.loads((out / "results.json").read_text()) == {"a": 1}
    assert (outside / "theirs.txt").read_text() == "theirs" and (out / "results.json.tmp").is_symlink()
    made = []
    import tempfile

    real = tempfile.mkstemp

    def spy(*args, **kwargs):
        made.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(tempfile, "mkstemp", spy)
    with atomic_write(out / "x.bin", out) as handle:
        np.save(handle, np.zeros(2))
    assert made and made[0]["dir"] == out and np.load(out / "x.bin").tolist() == [0.0, 0.0]


def test_a_failed_write_leaves_the_old_file_and_no_temporary_file(folders):
    out, _ = folders
    (out / "results.json").write_text("old")
    with pytest.raises(RuntimeError, match="broke"), atomic_write(out / "results.json", out) as handle:
        handle.write(b"half")
        raise RuntimeError("broke")
    assert (out / "results.json").read_text() == "old" and sorted(os.listdir(out)) == ["results.json"]


def test_a_tree_another_library_writes_into_holds_no_link(folders):
    out, outside = folders
    (out / "final" / "1_Pooling").mkdir(parents=True)
    check_output_tree(out / "final", out)
    check_output_tree(out / "missing", out)
    (out / "final" / "1_Pooling" / "config.json").symlink_to(out / "elsewhere.json")  # even a link inside
    with pytest.raises(OutsideOutputFolderError, match=r"1_Pooling/config.json is a symbolic link"):
        check_output_tree(out / "final", out)
    with pytest.raises(OutsideOutputFolderError, match="outside the output folder"):
        check_output_path(out / ".." / "outside" / "theirs.txt", out)


def test_remove_output_file_removes_only_a_regular_file_inside(folders):
    out, outside = folders
    (out / "link").symlink_to(outside / "theirs.txt")
    (out / "dir").mkdir()
    (out / "mine").write_text("x")
    assert remove_output_file(out / "link", out) is False and remove_output_file(out / "dir", out) is False
    assert remove_output_file(out / "mine", out) is True
    assert sorted(os.listdir(out)) == ["dir", "link"] and (outside / "theirs.txt").exists()


def test_the_lock_refuses_a_second_holder_and_is_gone_after(tmp_path):
    folder = tmp_path / "new" / "run"
    with output_lock(folder) as held:
        assert held == folder and (folder / LOCK_FILE).read_text() == f"{os.getpid()}\n"
        with pytest.raises(FolderInUseError, match=rf"--output-dir {folder}: the folder is in use by pid "
                                                   rf"{os.getpid()}"), output_lock(folder):
            pass  # flock locks belong to the open file: a second open in the same process is refused too
        assert (folder / LOCK_FILE).exists()
    assert not (tmp_path / "new").exists()  # the lock file and the folders made for it are gone
    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / LOCK_FILE).write_text("12345\n")  # left by a run that died: its lock died with it
    with output_lock(tmp_path / "kept"):
        assert (tmp_path / "kept" / LOCK_FILE).read_text() == f"{os.getpid()}\n"
    assert sorted(os.listdir(tmp_path / "kept")) == []


@pytest.mark.parametrize("umask", [0o022, 0o077])
@pytest.mark.parametrize("writer", list(WRITERS))
def test_written_files_get_the_mode_the_umask_gives_not_the_temporary_files(folders, writer, umask):
    out, _ = folders
    previous = os.umask(umask)
    try:
        path = out / ("written.png" if writer == "plot_run_curve" else "written.txt")
        WRITERS[writer](path, out)
    finally:
        os.umask(previous)
    assert oct(os.stat(path).st_mode & 0o777) == oct(0o666 & ~umask)
