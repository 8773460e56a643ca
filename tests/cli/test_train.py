"""``st-hardneg train``: --training-arg end to end on a tiny run, an exact resume of stateful losses from a CLI
checkpoint, the model card, the saved model without st-hardneg, and one line with the right exit status for each
bad input or failure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from st_hardneg import __version__, cli
from st_hardneg.testing.blocked import load_without_st_hardneg


def _argv(data: dict[str, Path], out: Path, *extra: str) -> list[str]:
    return ["train", "--task", "retrieval", "--model", str(data["model"]), "--data-dir", str(data["data"]),
            "--train-file", str(data["own"]), "--output-dir", str(out), "--no-sts", "-q", "--batch-size", "8", *extra]


def _state(out: Path, step: int) -> dict:
    return json.loads((out / "checkpoints" / f"checkpoint-{step}" / "trainer_state.json").read_text())


def _weights(out: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(out / "final" / "model.safetensors"))


# --------------------------------------------------------------------------- training arguments end to end
def test_gradient_accumulation_and_bf16_on_a_cpu(data, tmp_path):
    out = tmp_path / "run"
    argv = _argv(data, out, "--loss", "focal", "--training-arg", "gradient_accumulation_steps=2", "--training-arg",
                 "bf16=true", "--training-arg", "save_strategy=steps", "--training-arg", "save_steps=3",
                 "--training-arg", "logging_steps=1")
    assert cli.main(argv) == 0
    results = json.loads((out / "results.json").read_text())
    # 48 rows / 8 = 6 batches, 2 per optimizer step: 3 steps (the Trainer's count, planned before the run)
    assert results["planned_steps"] == results["steps"] == 3
    state = _state(out, 3)
    assert [row["step"] for row in state["log_history"] if "loss" in row] == [1, 2, 3]
    import torch

    args = torch.load(out / "checkpoints" / "checkpoint-3" / "training_args.bin", weights_only=False)
    assert args.gradient_accumulation_steps == 2 and args.bf16 and args.use_cpu and args.report_to == []
    run = json.loads((out / "checkpoints" / "checkpoint-3" / "st_hardneg_run.json").read_text())
    assert run == {"loss": "focal", "loss_args": {}}
    # the model card names st-hardneg: tag, version and the loss's documentation page
    card = (out / "final" / "README.md").read_text()
    header = card.split("---")[1]
    assert "- st-hardneg\n" in header and "- loss:FocalInfoNCELoss\n" in header
    assert f"version = {{{__version__}}}" in card
    assert "FocalInfoNCELoss: https://st-hardneg.readthedocs.io/en/latest/losses/focal.html" in card


@pytest.mark.parametrize("loss", [["--loss", "adcse"], ["--loss", "focal", "--loss-arg", "queue_size=16"]],
                         ids=["adcse", "focal-queue"])
def test_a_resumed_run_equals_the_uninterrupted_one(data, tmp_path, loss, capsys):
    common = [*loss, "--max-steps", "5", "--training-arg", "save_strategy=steps", "--training-arg", "save_steps=2",
              "--training-arg", "logging_steps=1"]
    assert cli.main(_argv(data, tmp_path / "full", *common)) == 0
    assert cli.main(_argv(data, tmp_path / "cut", *common, "--stop-after", "2")) == 0
    assert not (tmp_path / "cut" / "checkpoints" / "checkpoint-4").exists()
    resume = ["--training-arg", f"resume_from_checkpoint={tmp_path / 'cut' / 'checkpoints'}"]
    assert cli.main(_argv(data, tmp_path / "resumed", *common, *resume)) == 0
    full, resumed = _state(tmp_path / "full", 5), _state(tmp_path / "resumed", 5)
    losses = [[(row["step"], row["loss"]) for row in state["log_history"] if "loss" in row] for state in (full, resumed)]
    assert len(losses[0]) == 5 and losses[0] == losses[1]  # the same loss at every step, bit for bit
    a, b = _weights(tmp_path / "full"), _weights(tmp_path / "resumed")
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)
    # a checkpoint of another loss, or of other loss arguments, is refused before anything runs
    capsys.readouterr()
    assert cli.main(_argv(data, tmp_path / "other", "--loss", "mnrl", *resume)) == 2
    assert "is a checkpoint of loss" in capsys.readouterr().err
    assert not (tmp_path / "other").exists()


def test_resume_from_a_folder_without_a_checkpoint_is_refused(data, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    argv = _argv(data, tmp_path / "out", "--training-arg", f"resume_from_checkpoint={tmp_path / 'empty'}")
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "holds no checkpoint" in err
    assert cli.main(_argv(data, tmp_path / "out", "--training-arg", "resume_from_checkpoint=last")) == 2
    assert "no such folder" in capsys.readouterr().err


# --------------------------------------------------------------------------- saved models, the loss shown
def test_the_saved_model_loads_without_st_hardneg_and_the_head_only_on_request(data, tmp_path, capsys):
    out = tmp_path / "run"
    assert cli.main(_argv(data, out, "--loss", "mixcse", "--mlp-head", "--max-steps", "2")) == 0
    assert "loss mixcse:" not in capsys.readouterr().out  # -q: the loss is not announced
    modules = json.loads((out / "final" / "modules.json").read_text())
    assert [m["type"].rsplit(".", 1)[-1] for m in modules] == ["Transformer", "Pooling"]
    blocked = load_without_st_hardneg(out / "final", "my red cat sleeps .")
    assert blocked.returncode == 0, blocked.stderr
    vector, facts = blocked.read()
    assert (facts["modules"][-1], facts["loaded"]) == ("Pooling", False)
    from st_hardneg.models import load_checkpoint

    expected = load_checkpoint(out / "final").encode(["my red cat sleeps ."], convert_to_tensor=True)[0, :4]
    assert vector[:4] == pytest.approx(expected.tolist(), abs=1e-5)
    # the same process blocks st_hardneg for real: a folder with the head cannot load there
    kept = tmp_path / "kept"
    assert cli.main(_argv(data, kept, "--loss", "mixcse", "--mlp-head", "--save-train-head", "--max-steps", "2")) == 0
    modules = json.loads((kept / "final" / "modules.json").read_text())
    assert modules[-1]["type"] == "st_hardneg.models.TrainOnlyDense"
    refused = load_without_st_hardneg(kept / "final", "my red cat sleeps .")
    assert refused.returncode != 0 and "st_hardneg" in refused.stderr
    assert type(load_checkpoint(kept / "final")[-1]).__name__ == "TrainOnlyDense"


def test_the_loss_call_and_configuration_are_printed_at_start(data, tmp_path, monkeypatch, capsys):
    def stop(*args, **kwargs):
        raise RuntimeError("stopped after the announcement")

    monkeypatch.setattr("st_hardneg.training.experiment.run_training", stop)
    # the two-direction form has its own name (it was --loss mixcse's until one name meant one loss)
    argv = [a for a in _argv(data, tmp_path / "o", "--loss", "mixcse_two_way", "--loss-arg", "lam=0.3") if a != "-q"]
    assert cli.main(argv) == 1
    out = capsys.readouterr().out
    assert ("loss mixcse_two_way: MixCSELoss(model, directions=('query_to_doc', 'doc_to_query'), "
            "partition_mode='per_direction', lam=0.3)\n") in out
    config = json.loads(out.split("loss configuration: ", 1)[1].splitlines()[0])
    assert config["lam"] == 0.3 and config["directions"] == ["query_to_doc", "doc_to_query"]
    assert config["partition_mode"] == "per_direction"
    # the plain name is the class's default
    plain = [a for a in _argv(data, tmp_path / "p", "--loss", "mixcse", "--loss-arg", "lam=0.3") if a != "-q"]
    assert cli.main(plain) == 1
    assert "loss mixcse: MixCSELoss(model, lam=0.3)\n" in capsys.readouterr().out


# --------------------------------------------------------------------------- bad input: one line, exit 2
@pytest.fixture
def no_model(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the checks")

    monkeypatch.setattr("st_hardneg.models.resolve_model", refuse)


@pytest.mark.parametrize("extra, message", [
    (["--training-arg", "gradient_acumulation_steps=2"],
     "has no field gradient_acumulation_steps (did you mean gradient_accumulation_steps?)"),
    (["--training-arg", "gradient_accumulation_steps=2.5"], "gradient_accumulation_steps is a whole number"),
    (["--training-arg", "bf16=yes please"], "bf16 is true or false"),
    (["--training-arg", "learning_rate=1e-4"], "--training-arg learning_rate: set it with --lr"),
    (["--training-arg", "push_to_hub=true"], "push_to_hub=true needs hub_model_id=USER/NAME"),
    (["--training-arg", "fp16=true"], "fp16=true needs a CUDA GPU"),
    (["--training-arg", "save_strategy=no"], "--training-arg: the Trainer's arguments refuse this combination"),
    (["--stop-after", "12"], "--stop-after 12 is not before the end of the run (12 steps)"),
    (["--stop-after", "40"], "--stop-after 40 is not before the end of the run (12 steps)"),
    (["--save-train-head"], "--save-train-head keeps the head of --mlp-head"),
    (["--max-steps", "5", "--epochs", "2"], "--max-steps 5 sets the length of the run and --epochs 2 would be ignored"),
])
def test_bad_training_input_is_one_line_exit_2_before_any_model(tmp_path, no_model, capsys, extra, message,
                                                                 shared_data):
    corpus = tmp_path / "c.txt"
    corpus.write_text("".join(f"sentence number {i} on topic {i % 9}\n" for i in range(200)))
    out = tmp_path / "out"
    argv = ["train", "--corpus", str(corpus), "--data-dir", str(shared_data), "--batch-size", "16", "--output-dir",
            str(out), *extra]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert not out.exists()


def test_bf16_on_a_gpu_without_it_exits_2(tmp_path, no_model, monkeypatch, capsys):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a, **k: "Tesla T4")
    corpus = tmp_path / "c.txt"
    corpus.write_text("".join(f"sentence {i}\n" for i in range(100)))
    assert cli.main(["train", "--corpus", str(corpus), "--output-dir", str(tmp_path / "o"), "--training-arg",
                     "bf16=true"]) == 2
    assert "this GPU (Tesla T4) cannot compute in bfloat16" in capsys.readouterr().err


# --------------------------------------------------------------------------- failures at run time: exit 1
@pytest.mark.parametrize("error", [RuntimeError("CUDA out of memory"), OSError(28, "No space left on device"),
                                   ValueError("no usable row in this batch")])
def test_a_failure_during_training_exits_1(data, tmp_path, monkeypatch, capsys, error):
    def fail(*args, **kwargs):
        raise error

    monkeypatch.setattr("st_hardneg.training.loop.train", fail)
    assert cli.main(_argv(data, tmp_path / "o", "--loss", "focal")) == 1
    err = capsys.readouterr().err
    assert err.startswith("st-hardneg train: error: training failed: ") and err.count("\n") == 1
    assert str(error).split("] ")[-1] in err
    assert not (tmp_path / "o" / "results.json").exists()


def test_library_warnings_are_printed_on_stderr(data, tmp_path, monkeypatch, capsys):
    """--loss-arg temperature=20 trains as asked (a valid, if odd, temperature) and says so on stderr."""
    def stop(*args, **kwargs):
        raise RuntimeError("stopped")

    monkeypatch.setattr("st_hardneg.training.experiment.run_training", stop)
    argv = _argv(data, tmp_path / "o", "--loss", "focal", "--loss-arg", "temperature=20")
    assert cli.main([a for a in argv if a != "-q"]) == 1
    err = capsys.readouterr().err
    warning = [line for line in err.splitlines() if line.startswith("st-hardneg train: warning: ")]
    assert len(warning) == 1 and "temperature=20 means a temperature of 20" in warning[0]
    # -q hides warnings
    assert cli.main([*_argv(data, tmp_path / "o", "--loss", "focal", "--loss-arg", "temperature=20")]) == 1
    assert "warning" not in capsys.readouterr().err
