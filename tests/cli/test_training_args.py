"""``--training-arg`` (:mod:`st_hardneg.cli.training_args`): every TrainingArguments field by name and type, the
values reaching the Trainer over the recipe, one line for each bad item."""

from __future__ import annotations

import pytest

from st_hardneg.cli.training_args import parse_training_args, training_arg_items
from st_hardneg.training.loop import TrainConfig, training_arguments


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


def test_a_config_files_values_become_the_items_typed_on_the_command_line():
    values = {"gradient_accumulation_steps": 2, "bf16": True, "report_to": ["tensorboard", "wandb"],
              "lr_scheduler_kwargs": {"power": 2}, "save_total_limit": None, "max_grad_norm": 0.5}
    items = training_arg_items(values)
    assert items == ["gradient_accumulation_steps=2", "bf16=true", "report_to=tensorboard,wandb",
                     'lr_scheduler_kwargs={"power": 2}', "save_total_limit=none", "max_grad_norm=0.5"]
    assert parse_training_args(items) == values
