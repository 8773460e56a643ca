"""``st_hardneg.training.loop``'s command-line helpers: every TrainingArguments field by name and type, precision
and Hub checks before any model loads, and the checkpoint a run resumes from."""

from __future__ import annotations

import json

import pytest

from st_hardneg.training.callbacks import CHECKPOINT_RUN_FILE
from st_hardneg.training.loop import (
    TrainConfig,
    check_hub_access,
    check_precision,
    find_checkpoint,
    parse_training_args,
    training_arguments,
)


def test_values_take_their_field_type():
    parsed = parse_training_args([
        "gradient_accumulation_steps=2", "bf16=true", "report_to=tensorboard", "save_strategy=steps", "save_steps=4",
        "max_grad_norm=0.5", "lr_scheduler_kwargs={\"power\": 2}", "label_names=a,b", "hub_model_id=me/model",
        "save_total_limit=none",
    ])
    assert parsed == {"gradient_accumulation_steps": 2, "bf16": True, "report_to": "tensorboard",
                      "save_strategy": "steps", "save_steps": 4.0, "max_grad_norm": 0.5,
                      "lr_scheduler_kwargs": {"power": 2}, "label_names": ["a", "b"], "hub_model_id": "me/model",
                      "save_total_limit": None}
    assert type(parsed["gradient_accumulation_steps"]) is int and type(parsed["save_steps"]) is float
    assert parse_training_args(["report_to=tensorboard,wandb"]) == {"report_to": ["tensorboard", "wandb"]}


def test_the_values_reach_the_trainer_over_the_recipe(tmp_path):
    extra = parse_training_args(["gradient_accumulation_steps=3", "report_to=none", "logging_steps=2"])
    args = training_arguments(TrainConfig(output_dir=str(tmp_path), extra_args=extra), with_evaluator=False)
    assert args.gradient_accumulation_steps == 3 and args.logging_steps == 2 and args.report_to == []
    # the recipe's own values stay where nothing is given
    assert args.per_device_train_batch_size == 64 and args.lr_scheduler_type == "linear"


@pytest.mark.parametrize("item, message", [
    ("gradient_acumulation_steps=2", "has no field gradient_acumulation_steps (did you mean gradient_accumulation_steps?)"),
    ("gradient_accumulation_steps=two", "gradient_accumulation_steps='two': gradient_accumulation_steps is a whole number"),
    ("bf16=maybe", "bf16='maybe': bf16 is true or false"),
    ("max_grad_norm=big", "max_grad_norm is a number"),
    ("save_strategy=step", "not a choice of save_strategy (did you mean steps?)"),
    ("lr_scheduler_kwargs={oops", "takes a JSON object"),
    ("learning_rate=1e-4", "--training-arg learning_rate: set it with --lr"),
    ("bf16", "expects KEY=VALUE"),
])
def test_bad_items_are_one_line(item, message):
    reserved = {"learning_rate": "--lr"}
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("?", r"\?")
                       .replace("{", r"\{")):
        parse_training_args([item], reserved=reserved)


def test_a_field_given_twice_is_refused():
    with pytest.raises(ValueError, match="gives bf16 twice"):
        parse_training_args(["bf16=true", "bf16=false"])


def test_bf16_on_a_cpu_runs_on_the_cpu(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert check_precision({"bf16": True}) == {"bf16": True, "use_cpu": True}
    assert check_precision({"gradient_accumulation_steps": 2}) == {"gradient_accumulation_steps": 2}
    with pytest.raises(ValueError, match="fp16=true needs a CUDA GPU"):
        check_precision({"fp16": True})
    with pytest.raises(ValueError, match="exclusive"):
        check_precision({"fp16": True, "bf16": True})


def test_bf16_on_a_gpu_without_it_is_refused(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a, **k: "Tesla T4")
    with pytest.raises(ValueError, match=r"this GPU \(Tesla T4\) cannot compute in bfloat16"):
        check_precision({"bf16": True})
    assert check_precision({"fp16": True}) == {"fp16": True}


def test_push_to_hub_needs_a_repository_a_token_and_a_network(monkeypatch):
    import huggingface_hub

    check_hub_access({})  # nothing to push, nothing checked
    with pytest.raises(ValueError, match="push_to_hub=true needs hub_model_id=USER/NAME"):
        check_hub_access({"push_to_hub": True})
    with pytest.raises(ValueError, match="hub_model_id is set but push_to_hub is not"):
        check_hub_access({"hub_model_id": "me/model"})
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ValueError, match="HF_HUB_OFFLINE is set"):
        check_hub_access({"push_to_hub": True, "hub_model_id": "me/model"})
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: None)
    with pytest.raises(ValueError, match="needs a Hugging Face token"):
        check_hub_access({"push_to_hub": True, "hub_model_id": "me/model"})

    def unreachable(self, token=None):
        raise ConnectionError("Failed to resolve 'huggingface.co'")

    monkeypatch.setattr(huggingface_hub.HfApi, "whoami", unreachable)
    with pytest.raises(ValueError, match="does not answer with this token: Failed to resolve 'huggingface.co'"):
        check_hub_access({"push_to_hub": True, "hub_model_id": "me/model", "hub_token": "hf_x"})


def _checkpoint(folder, loss="adcse", loss_args=None):
    folder.mkdir(parents=True)
    (folder / "trainer_state.json").write_text("{}")
    (folder / CHECKPOINT_RUN_FILE).write_text(json.dumps({"loss": loss, "loss_args": loss_args or {}}))
    return folder


def test_find_checkpoint_takes_the_latest_of_a_folder_and_checks_the_loss(tmp_path):
    _checkpoint(tmp_path / "checkpoint-3")
    latest = _checkpoint(tmp_path / "checkpoint-10")
    run = {"loss": "adcse", "loss_args": {}}
    assert find_checkpoint(str(tmp_path), run) == str(latest)
    assert find_checkpoint(str(tmp_path / "checkpoint-3"), run) == str(tmp_path / "checkpoint-3")
    with pytest.raises(ValueError, match="is a checkpoint of loss 'adcse', this run trains 'focal'"):
        find_checkpoint(str(tmp_path), {"loss": "focal", "loss_args": {}})
    with pytest.raises(ValueError, match="is a checkpoint of loss_args {}, this run trains {'queue_size': 8}"):
        find_checkpoint(str(tmp_path), {"loss": "adcse", "loss_args": {"queue_size": 8}})


def test_find_checkpoint_refuses_folders_without_one(tmp_path):
    with pytest.raises(ValueError, match="holds no checkpoint"):
        find_checkpoint(str(tmp_path))
    with pytest.raises(ValueError, match="no such folder"):
        find_checkpoint(str(tmp_path / "missing"))
    foreign = tmp_path / "checkpoint-2"
    foreign.mkdir()
    (foreign / "trainer_state.json").write_text("{}")
    with pytest.raises(ValueError, match="was not written by st-hardneg train"):
        find_checkpoint(str(tmp_path), {"loss": "adcse", "loss_args": {}})
