"""``st_hardneg.cli.paths``: an output place is proven writable with a probe file, and nothing is left behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from st_hardneg import cli
from st_hardneg.cli.paths import ensure_writable_dir, ensure_writable_file

PROC = Path("/proc/self").exists()


def test_a_new_nested_folder_passes_and_is_removed_again(tmp_path):
    target = tmp_path / "a" / "b" / "c"
    assert ensure_writable_dir(target) == target
    assert list(tmp_path.iterdir()) == []  # a/, b/, c/ and the probe are gone


def test_an_existing_folder_keeps_exactly_its_files(tmp_path):
    (tmp_path / "keep.txt").write_text("x")
    ensure_writable_dir(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt"]


@pytest.mark.skipif(not PROC, reason="needs /proc")
def test_proc_is_refused_although_os_access_allows_it(tmp_path):
    with pytest.raises(ValueError, match=r"^--output /proc/nope.json cannot be written"):
        ensure_writable_file("/proc/nope.json")
    with pytest.raises(ValueError, match=r"^--output-dir /proc/run cannot be written"):
        ensure_writable_dir("/proc/run")


@pytest.mark.parametrize("make, call, message", [
    (lambda t: (t / "f").write_text("x"), lambda t: ensure_writable_dir(t / "f"), "is a file, not a folder"),
    (lambda t: (t / "f").write_text("x"), lambda t: ensure_writable_dir(t / "f" / "sub"), "cannot be written"),
    (lambda t: None, lambda t: ensure_writable_file(t), "is a folder; give a file path"),
    (lambda t: None, lambda t: ensure_writable_dir(" "), "--output-dir is empty"),
])
def test_bad_places_are_one_line(tmp_path, make, call, message):
    make(tmp_path)
    with pytest.raises(ValueError, match=message):
        call(tmp_path)


@pytest.mark.skipif(not PROC, reason="needs /proc")
def test_train_refuses_an_unwritable_output_dir_before_any_model(tmp_path, monkeypatch, capsys):
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr("st_hardneg.models.resolve_model", refuse)
    corpus = tmp_path / "c.txt"
    corpus.write_text("".join(f"sentence {i}\n" for i in range(100)))
    assert cli.main(["train", "--corpus", str(corpus), "--output-dir", "/proc/st-hardneg-run"]) == 2
    assert "--output-dir /proc/st-hardneg-run cannot be written" in capsys.readouterr().err
