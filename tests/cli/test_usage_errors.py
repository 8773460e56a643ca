"""Usage errors before any model loads (docs/guarantees.md): every ``--loss-arg`` value through the loss's own
checks, the ``--training-arg`` ranges transformers checks late or never, ``report_to`` trackers that are not
installed; and ``download`` without a network names the URL and the cause."""

from __future__ import annotations

import pytest

from st_hardneg import cli


@pytest.fixture
def no_model(monkeypatch):
    """Any model load fails the test: a usage error must come first."""
    from st_hardneg import models

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the usage error")

    for name in ("load_model", "load_checkpoint", "training_model", "load_default_model"):
        monkeypatch.setattr(models, name, refuse)


def _one_line_exit_2(argv, capsys) -> str:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize("loss, arg, fragment", [
    ("mixcse", "lam=3", "lam (λ, the weight of the positive in the mix) must be a finite number in [0, 1], got 3"),
    ("hncse_hnm", "k=0", "k must be an integer >= 2, got 0"),
    ("adcse", "num_adversaries=-1", "num_adversaries (M) must be a non-negative integer, got -1"),
    ("mnrl", "temperature=0", "temperature must be a finite number > 0, got 0"),
    ("focal", "mini_batch_size=0", "mini_batch_size must be a positive integer or None, got 0"),
])
def test_a_bad_loss_value_is_a_usage_error_before_any_model(no_model, tmp_path, capsys, loss, arg, fragment):
    err = _one_line_exit_2(["train", "--loss", loss, "--loss-arg", arg, "--output-dir", str(tmp_path / "o")], capsys)
    assert f"--loss-arg: loss {loss!r}: {fragment}" in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("arg, fragment", [
    ("gradient_accumulation_steps=0", "gradient_accumulation_steps is a whole number of batches >= 1"),
    ("max_grad_norm=-1", "max_grad_norm is a gradient norm >= 0"),
    ("weight_decay=-0.1", "weight_decay is a decay >= 0"),
    ("save_total_limit=-1", "save_total_limit is a number of checkpoints >= 1"),
    ("per_device_eval_batch_size=0", "per_device_eval_batch_size is a batch size >= 1"),
    ("label_smoothing_factor=2", "label_smoothing_factor is a share in [0, 1)"),
    ("adam_beta1=1.5", "adam_beta1 is a decay rate in [0, 1)"),
    ("adam_epsilon=0", "adam_epsilon is a number > 0"),
    ("dataloader_num_workers=-2", "dataloader_num_workers is a number of worker processes >= 0"),
    ("adam_epsilon=nan", "adam_epsilon is a number > 0"),
])
def test_a_training_arg_out_of_range_is_a_usage_error(no_model, tmp_path, capsys, arg, fragment):
    err = _one_line_exit_2(["train", "--training-arg", arg, "--output-dir", str(tmp_path / "o")], capsys)
    assert f"--training-arg {arg.split('=')[0]}=" in err and fragment in err


def test_a_tracker_that_is_not_installed_is_a_usage_error(no_model, tmp_path, capsys, monkeypatch):
    import transformers.integrations as integrations

    monkeypatch.setattr(integrations, "get_available_reporting_integrations", lambda: ["tensorboard"])
    err = _one_line_exit_2(["train", "--training-arg", "report_to=wandb", "--output-dir", str(tmp_path / "o")], capsys)
    assert "report_to=wandb: wandb is not installed (pip install wandb); installed: tensorboard" in err
    err = _one_line_exit_2(["train", "--training-arg", "report_to=nonsense", "--output-dir", str(tmp_path / "o")],
                           capsys)
    assert "report_to: nonsense is not supported" in err


def test_download_offline_names_the_url_and_the_cause(tmp_path, capsys, monkeypatch):
    import urllib.error
    import urllib.request

    from st_hardneg.data.senteval import SENTEVAL_URL

    def unreachable(*args, **kwargs):
        raise urllib.error.URLError(OSError(-2, "Name or service not known"))

    monkeypatch.setattr(urllib.request, "urlopen", unreachable)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    assert cli.main(["download", "senteval", "--dest", str(tmp_path / "d")]) == 1
    err = capsys.readouterr().err.strip()
    assert f"cannot download {SENTEVAL_URL}: no network (the host name does not resolve)" in err
    assert len(err.splitlines()) == 1
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert cli.main(["download", "senteval", "--dest", str(tmp_path / "d")]) == 1
    assert f"cannot download {SENTEVAL_URL}: HF_HUB_OFFLINE is set" in capsys.readouterr().err


def test_download_into_a_file_says_the_destination_is_a_file(tmp_path, capsys, monkeypatch):
    import urllib.request

    def no_request(*args, **kwargs):
        raise AssertionError("a request was made")

    monkeypatch.setattr(urllib.request, "urlopen", no_request)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    file = tmp_path / "notes.txt"
    file.write_text("mine")
    for what, dest, message in (("senteval", file, f"--dest {file} is a file, not a folder"),
                                ("wiki1m", file / "sub", f"--dest {file / 'sub'}: its parent {file} is a file")):
        assert cli.main(["download", what, "--dest", str(dest)]) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1
    assert file.read_text() == "mine"


def test_a_damaged_checkpoint_run_file_is_named(no_model, tmp_path, capsys):
    folder = tmp_path / "ckpt" / "checkpoint-2"
    folder.mkdir(parents=True)
    (folder / "trainer_state.json").write_text("{}")
    (folder / "st_hardneg_run.json").write_text("{broken")
    err = _one_line_exit_2(["train", "--training-arg", f"resume_from_checkpoint={folder}", "--output-dir",
                            str(tmp_path / "o")], capsys)
    assert "st_hardneg_run.json is damaged" in err and "resume from another checkpoint" in err


def test_eval_cache_dir_is_checked_before_the_model_loads(no_model, tmp_path, capsys):
    (tmp_path / "file").write_text("not a folder")
    err = _one_line_exit_2(["eval", "--cache-dir", str(tmp_path / "file" / "cache"), "--output-dir",
                            str(tmp_path / "r")], capsys)
    assert "--cache-dir" in err
