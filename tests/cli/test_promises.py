"""The command line's promises on bad input: every input is checked before a model loads, one clear line names the
option, a finished run is never overwritten silently, and no temporary file is left behind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from st_hardneg import cli
from st_hardneg.reporting import write_json
from st_hardneg.training.registry import LOSSES, check_loss_args, loss_argument_names, parse_loss_args

STSB_ROW = "main-captions\tMSRvid\t2012test\t{i:04d}\t{g}\t{a}\t{b}"


class _ModelLoaded(Exception):
    """Raised by the patched model loaders: reaching them means every check passed."""


@pytest.fixture
def no_model(monkeypatch):
    """Any model load fails the test's expectations loudly (the checks must come first)."""

    def refuse(*args, **kwargs):
        raise _ModelLoaded

    monkeypatch.setattr("st_hardneg.models.resolve_model", refuse)
    monkeypatch.setattr("st_hardneg.cli.evaluate.load_for_eval", refuse)
    return refuse


@pytest.fixture
def corpus(tmp_path) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_text("".join(f"sentence number {i} about topic {i % 7}\n" for i in range(200)))
    return path


def _train(tmp_path, corpus, *extra, data_dir=None):
    argv = ["train", "--corpus", str(corpus), "--output-dir", str(tmp_path / "out"), *extra]
    if data_dir is not None:
        argv = ["train", "--data-dir", str(data_dir), *argv[1:]]
    return cli.main(argv)


# --------------------------------------------------------------------------- loss and mining arguments
@pytest.mark.parametrize("items, message", [
    (["m=0.2", "m=0.3"], "--loss-arg gives m twice (m=0.2 and 'm=0.3')"),
    (["hnm-pool=all_negatives", "hnm_pool=hard_negatives"], "gives hnm_pool twice"),
    (["m"], "--loss-arg expects KEY=VALUE, got 'm'"),
    (["=3"], "expects KEY=VALUE"),
])
def test_parse_loss_args_refuses_ambiguity(items, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_loss_args(items)


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_every_loss_names_its_arguments_and_refuses_others(name):
    accepted = loss_argument_names(name)
    assert "model" not in accepted and "self" not in accepted
    assert ("temperature" in accepted) and ("mode" not in accepted)
    check_loss_args(name, {"temperature": 0.05})  # accepted
    with pytest.raises(ValueError, match=f"loss '{name}' takes no argument bogus"):
        check_loss_args(name, {"bogus": 1})


def test_a_misspelt_argument_gets_a_suggestion():
    with pytest.raises(ValueError, match=r"tempreature \(did you mean temperature\?\)"):
        check_loss_args("focal", {"tempreature": 0.1})


@pytest.mark.parametrize("extra, message", [
    (["--loss-arg", "model=bert-base-uncased"], "the model is not a loss argument; choose it with --model"),
    (["--loss", "focal", "--loss-arg", "m=0.2", "--loss-arg", "m=0.3"], "gives m twice"),
    (["--loss", "focal", "--loss-arg", "lam=0.2"], "loss 'focal' takes no argument lam"),
    (["--eval-batch-size", "0"], "--eval-batch-size must be >= 1, got 0"),
    (["--max-seq-length", "0"], "--max-seq-length must be >= 1 token, got 0"),
    (["--limit", "-1"], "--limit must be >= 0"),
    (["--batch-size", "0"], "--batch-size must be >= 1"),
    (["--lr", "nan"], "--lr must be > 0"),
    (["--warmup-ratio", "1"], "--warmup-ratio must be in [0, 1)"),
    (["--epochs", "0"], "--epochs must be > 0"),
    (["--task", "retrieval", "--mining-arg", "num_candidates=3", "--mining-arg", "num_candidates=4"],
     "--mining-arg gives num_candidates twice"),
])
def test_train_options_fail_before_the_model_loads(tmp_path, corpus, capsys, no_model, extra, message):
    if "--task" in extra:  # --corpus belongs to --task sts
        argv = ["train", "--output-dir", str(tmp_path / "out"), *extra]
        assert cli.main(argv) == 2
    else:
        assert _train(tmp_path, corpus, *extra) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()  # nothing written


def test_empty_output_dir_is_refused(tmp_path, corpus, capsys, no_model):
    assert cli.main(["train", "--corpus", str(corpus), "--output-dir", ""]) == 2
    assert "--output-dir is empty" in capsys.readouterr().err


def test_output_dir_that_is_a_file_is_refused(tmp_path, corpus, capsys, no_model):
    (tmp_path / "out").write_text("a file")
    assert _train(tmp_path, corpus) == 2
    assert "is a file, not a folder" in capsys.readouterr().err


def test_finished_run_is_kept_unless_overwrite(tmp_path, corpus, capsys, no_model, shared_data):
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.json").write_text('{"finished": true}')
    assert _train(tmp_path, corpus) == 2
    assert "holds a finished run (results.json)" in capsys.readouterr().err
    assert json.loads((out / "results.json").read_text()) == {"finished": True}
    with pytest.raises(_ModelLoaded):  # --overwrite: every check passes and the model is loaded next
        _train(tmp_path, corpus, "--overwrite", "--data-dir", str(shared_data))


# --------------------------------------------------------------------------- damaged data before any training
def _sts_tree(root: Path) -> Path:
    """A complete STS tree (every file of the 7 tasks and STS-B dev), a few pairs each."""
    from st_hardneg.data import STS_YEAR_SUBSETS

    for year, subsets in STS_YEAR_SUBSETS.items():
        folder = root / "STS" / f"{year}-en-test"
        folder.mkdir(parents=True)
        for name in subsets:
            (folder / f"STS.input.{name}.txt").write_text("a b\tc d\ne f\tg h\ni j\tk l\n")
            (folder / f"STS.gs.{name}.txt").write_text("1.0\n2.0\n3.0\n")
    stsb = root / "STS" / "STSBenchmark"
    stsb.mkdir(parents=True)
    for split in ("dev", "test"):
        rows = [STSB_ROW.format(i=i, g=0.5 + i, a=f"one {i}", b=f"two {i}") for i in range(4)]
        (stsb / f"sts-{split}.csv").write_text("\n".join(rows) + "\n")
    (root / "SICK").mkdir()
    sick = ["pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment"]
    sick += [f"{i}\tx {i}\ty {i}\t{1 + i * 0.7:.1f}\tNEUTRAL" for i in range(4)]
    (root / "SICK" / "SICK_test_annotated.txt").write_text("\n".join(sick) + "\n")
    return root


@pytest.mark.parametrize("command", ["train", "eval"])
def test_damaged_sts_test_file_fails_before_any_training(tmp_path, corpus, capsys, no_model, command):
    root = _sts_tree(tmp_path / "senteval")
    test_file = root / "STS" / "STSBenchmark" / "sts-test.csv"
    test_file.write_text(test_file.read_text() + "main-captions\tMSRvid\t2012test\t0009\tnot-a-score\tx\ty\n")
    if command == "train":
        assert _train(tmp_path, corpus, data_dir=root) == 2
    else:
        assert cli.main(["eval", "--data-dir", str(root)]) == 2
    err = capsys.readouterr().err
    assert "sts-test.csv" in err and "line 5" in err
    assert not (tmp_path / "out").exists()


def test_intact_sts_tree_passes_the_early_check(tmp_path, corpus, no_model):
    root = _sts_tree(tmp_path / "senteval")
    with pytest.raises(_ModelLoaded):
        _train(tmp_path, corpus, data_dir=root)


# --------------------------------------------------------------------------- eval --output and atomic writes
@pytest.mark.parametrize("target, message", [
    ("file/under/a/file.json", "cannot be written"),
    ("", "--output is empty"),
    ("folder.json", "is a folder"),  # a path ending in .json is the results file ("." is now an output folder)
    ("file/under/a/folder", "cannot be written"),
])
def test_eval_output_is_checked_before_evaluating(tmp_path, capsys, no_model, monkeypatch, target, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "file").write_text("x")
    (tmp_path / "folder.json").mkdir()
    assert cli.main(["eval", "--tasks", "align", "--output", target]) == 2
    assert message in capsys.readouterr().err


def test_eval_output_in_a_new_folder_passes_the_check(tmp_path, no_model):
    with pytest.raises(_ModelLoaded):
        cli.main(["eval", "--tasks", "align", "--output", str(tmp_path / "new" / "folder" / "scores.json")])
    assert not (tmp_path / "new").exists()  # nothing created by the check


@pytest.mark.parametrize("argv, message", [
    (["eval", "--tasks", "sts,sts"], "names a group twice"),
    (["eval", "--batch-size", "0"], "--batch-size must be >= 1, got 0"),
    (["eval", "--tasks", "sts,bogus"], "--tasks: unknown ['bogus']"),
])
def test_eval_options_fail_before_the_model_loads(argv, message, capsys, no_model):
    assert cli.main(argv) == 2
    assert message in capsys.readouterr().err


def test_write_json_leaves_no_temporary_file_when_the_write_fails(tmp_path, monkeypatch):
    target = tmp_path / "results.json"

    def broken_replace(self, other):
        raise OSError("disk full")

    monkeypatch.setattr(Path, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        write_json(target, {"a": 1})
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    write_json(target, {"a": 1})
    assert json.loads(target.read_text()) == {"a": 1} and [p.name for p in tmp_path.iterdir()] == ["results.json"]
