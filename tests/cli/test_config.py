"""``st-hardneg train --config FILE.{json,yaml}`` (HfArgumentParser's conventions) reproduces the run of the same
flags; flags override the file; a bad file is one line naming the file and the key, exit 2, before any model loads;
HF's spellings of the flags (``--per_device_train_batch_size 8``) are read as st-hardneg's and said so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from st_hardneg import cli
from st_hardneg.cli.config import hf_style_argv, read_train_config
from st_hardneg.testing.beir import make_tiny_beir

#: results.json "config" entries that name the file or the command itself, not the run
NOT_THE_RUN = ("config", "command_line", "output_dir")


class _ModelLoaded(Exception):
    """Raised by the patched model loader: reaching it means every check passed."""


@pytest.fixture
def no_model(monkeypatch):
    def refuse(*args, **kwargs):
        raise _ModelLoaded

    monkeypatch.setattr("st_hardneg.models.resolve_model", refuse)


def _train_parser():
    return cli.app.subcommand_parser(cli.build_parser(), "train")


def _flags(beir: Path, model: Path, cache: Path) -> list[str]:
    return ["--task", "beir", "--data", str(beir), "--model", str(model), "--loss", "mixcse", "--loss-arg", "lam=0.3",
            "--loss-arg", "partner=random", "--max-steps", "2", "--batch-size", "4", "--mining-arg",
            "relative_margin=None", "--cache-dir", str(cache), "--training-arg", "gradient_accumulation_steps=2",
            "--training-arg", "logging_steps=1", "--seed", "3"]


def _file_values(beir: Path, model: Path, cache: Path) -> dict:
    """The flags of :func:`_flags` as a config file holds them: option names with underscores, the loss options as
    a mapping, TrainingArguments fields at the top level (the batch size by its TrainingArguments name)."""
    return {"task": "beir", "data": str(beir), "model": str(model), "loss": "mixcse",
            "loss_arg": {"lam": 0.3, "partner": "random"}, "max_steps": 2, "per_device_train_batch_size": 4,
            "mining_arg": ["relative_margin=None"], "cache_dir": str(cache), "gradient_accumulation_steps": 2,
            "logging_steps": 1, "seed": 3}


def _run(argv: list[str], out: Path) -> dict:
    assert cli.main(["train", *argv, "--output-dir", str(out), "-q"]) == 0
    return json.loads((out / "results.json").read_text())


def _the_run(results: dict) -> dict:
    """What makes the run: every resolved setting (not the file or the command that gave it), the loss's
    configuration, the steps and the scores."""
    return {"config": {k: v for k, v in results["config"].items() if k not in NOT_THE_RUN},
            "loss_config": results["loss_config"], "steps": results["steps"], "dev": results["dev"],
            "test": results["test"]}


def test_a_json_and_a_yaml_config_reproduce_the_run_of_the_flags(tiny_model_dir, tmp_path):
    beir, cache = make_tiny_beir(tmp_path / "tiny"), tmp_path / "cache"
    flags = _run(_flags(beir, tiny_model_dir, cache), tmp_path / "flags")
    values = _file_values(beir, tiny_model_dir, cache)
    (tmp_path / "run.json").write_text(json.dumps(values))
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(values))
    from_json = _run(["--config", str(tmp_path / "run.json")], tmp_path / "json")
    from_yaml = _run(["--config", str(tmp_path / "run.yaml")], tmp_path / "yaml")
    expected = _the_run(flags)
    assert expected["config"]["extra_training_args"] == {"gradient_accumulation_steps": 2, "logging_steps": 1}
    assert expected["loss_config"]["lam"] == 0.3 and expected["loss_config"]["partner"] == "random"
    assert expected["config"]["batch_size"] == 4 and expected["config"]["seed"] == 3
    assert _the_run(from_json) == expected
    assert _the_run(from_yaml) == expected
    assert from_yaml["config"]["config"] == str(tmp_path / "run.yaml")


def test_flags_override_the_file_and_repeatable_options_key_by_key(tmp_path, no_model):
    (tmp_path / "c.yaml").write_text("seed: 5\nbatch_size: 16\nloss_arg: {lam: 0.3, partner: random}\n"
                                     "gradient_accumulation_steps: 4\n")
    parser = cli.build_parser()
    args = cli.app._train_argv(parser, ["train", "--config", str(tmp_path / "c.yaml"), "--seed", "1", "--loss-arg",
                                        "lam=0.1", "--training-arg", "gradient_accumulation_steps=2"])
    assert args.seed == 1 and args.batch_size == 16  # the flag wins, the file fills the rest
    assert args.loss_arg == ["partner=random", "lam=0.1"]
    assert args.training_arg == ["gradient_accumulation_steps=2"]


@pytest.mark.parametrize("name, text, message", [
    ("bad.json", '{"loss": "mixcse",', "bad.json: does not parse as JSON"),
    ("bad.yaml", "loss: [mixcse\n", "bad.yaml: does not parse as YAML"),
    ("list.yaml", "- loss\n", "list.yaml: the file holds list, not a mapping"),
    ("unknown.yaml", "los: mixcse\n", "unknown.yaml: los: not an option of st-hardneg train nor a field of "
                                      "SentenceTransformerTrainingArguments (did you mean loss?)"),
    ("type.yaml", "batch_size: eight\n", "type.yaml: batch_size: a whole number, got 'eight' (--batch-size)"),
    ("choice.json", '{"loss": "mixcs"}', "choice.json: loss: one of "),
    ("flag.yaml", "overwrite: 1\n", "flag.yaml: overwrite: true or false, got 1 (--overwrite)"),
    ("field.yaml", "gradient_accumulation_steps: two\n",
     "field.yaml gradient_accumulation_steps='two': gradient_accumulation_steps is a whole number"),
    ("bool.yaml", "bf16: maybe\n", "bool.yaml bf16='maybe': bf16 is true or false"),
    ("twice.yaml", "lr: 0.1\nlearning_rate: 0.2\n", "twice.yaml: learning_rate: gives --lr again (as lr)"),
    ("reserved.yaml", "warmup_steps: 3\n", "reserved.yaml: warmup_steps: set it with --warmup-ratio"),
    ("loss.yaml", "loss_arg: 0.3\n", "loss.yaml: loss_arg: a mapping of KEY: VALUE or a list of 'KEY=VALUE'"),
    ("config.txt", "loss: mixcse\n", "config.txt: a config file is .json, .yaml or .yml"),
])
def test_a_bad_config_file_is_one_line_naming_the_file_and_the_key(tmp_path, capsys, no_model, name, text, message):
    (tmp_path / name).write_text(text)
    assert cli.main(["train", "--config", str(tmp_path / name), "--output-dir", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith("st-hardneg train: error: ")
    assert message in err and str(tmp_path) in err
    assert not (tmp_path / "o").exists()


def test_a_missing_config_file_is_named(tmp_path, capsys, no_model):
    assert cli.main(["train", "--config", str(tmp_path / "none.yaml")]) == 2
    assert f"--config {tmp_path / 'none.yaml'}: no such file" in capsys.readouterr().err


def test_an_empty_file_is_no_setting(tmp_path):
    (tmp_path / "empty.yaml").write_text("")
    config = read_train_config(tmp_path / "empty.yaml", _train_parser())
    assert config.defaults == {} and config.items == {}


def test_hf_spellings_are_read_as_st_hardnegs_and_said_so(tmp_path, capsys, no_model):
    parser = _train_parser()
    argv, notes = hf_style_argv(["--per_device_train_batch_size", "8", "--gradient_accumulation_steps=2", "--bf16",
                                 "--output_dir", "o", "--loss", "focal"], parser)
    assert argv == ["--batch-size", "8", "--training-arg", "gradient_accumulation_steps=2", "--training-arg",
                    "bf16=true", "--output-dir", "o", "--loss", "focal"]
    assert notes == ["--per_device_train_batch_size 8 is read as --batch-size 8",
                     "--gradient_accumulation_steps 2 is read as --training-arg gradient_accumulation_steps=2",
                     "--bf16 true is read as --training-arg bf16=true"]
    args = cli.app._train_argv(cli.build_parser(), ["train", "--per_device_train_batch_size", "8"])
    assert args.batch_size == 8
    assert "--per_device_train_batch_size 8 is read as --batch-size 8" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--warmup_steps", "3"], "--warmup_steps is a TrainingArguments field that st-hardneg train sets with "
                              "--warmup-ratio"),
    (["--save_steps"], "--save_steps (a TrainingArguments field) needs a value: --training-arg save_steps=VALUE"),
])
def test_hf_spellings_that_cannot_be_read_are_one_line(tmp_path, capsys, no_model, argv, message):
    assert cli.main(["train", *argv, "--output-dir", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and message in err
