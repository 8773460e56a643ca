"""The training recipe's screening option: ``stop_after_steps`` keeps the full run's schedule and stops early."""

from __future__ import annotations

import pytest
import torch
from sentence_transformers.base.evaluation import BaseEvaluator
from transformers import TrainerCallback

from st_hardneg.data import pair_dataset
from st_hardneg.training import StopAfterSteps, TrainConfig, build_loss, train


class _Snapshot(TrainerCallback):
    """Copies the model's parameters after optimizer step ``step``."""

    def __init__(self, model, step: int):
        self.model, self.step, self.params = model, step, None

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            self.params = {k: v.detach().clone() for k, v in self.model.state_dict().items()}


def _config(tmp_path, name: str, **kwargs) -> TrainConfig:
    return TrainConfig(output_dir=str(tmp_path / name), batch_size=4, learning_rate=1e-2, logging_steps=1,
                       show_progress_bar=False, save_checkpoints=False, **kwargs)


def _lrs(result) -> list[float]:
    return [row["learning_rate"] for row in result.log_history if "learning_rate" in row]


def test_stop_after_steps_is_the_prefix_of_the_full_run(tiny_model_dir, tiny_sentences, tmp_path):
    from st_hardneg.models import load_model

    data = pair_dataset(tiny_sentences)  # 16 sentences, batch 4: a 4-step epoch

    full_model = load_model(tiny_model_dir, pooling="cls", max_seq_length=32, device="cpu")
    snap = _Snapshot(full_model, 2)
    full = train(full_model, data, build_loss("mnrl", full_model), _config(tmp_path, "full"), callbacks=[snap])
    assert full.steps == 4 and snap.params is not None

    cut_model = load_model(tiny_model_dir, pooling="cls", max_seq_length=32, device="cpu")
    cut = train(cut_model, data, build_loss("mnrl", cut_model), _config(tmp_path, "cut", stop_after_steps=2))
    assert cut.steps == 2
    # the learning rates of the first two steps are those of the 4-step linear schedule: 1e-2, then 1e-2 * 3/4
    assert _lrs(full)[:2] == pytest.approx([1e-2, 7.5e-3])
    assert _lrs(cut) == pytest.approx(_lrs(full)[:2])
    for name, value in cut_model.state_dict().items():
        torch.testing.assert_close(value, snap.params[name], rtol=0, atol=0, msg=name)

    # max_steps=2 instead shortens the schedule (1e-2, then 5e-3): a different model, which is why the option exists
    short_model = load_model(tiny_model_dir, pooling="cls", max_seq_length=32, device="cpu")
    short = train(short_model, data, build_loss("mnrl", short_model), _config(tmp_path, "short", max_steps=2))
    assert _lrs(short) == pytest.approx([1e-2, 5e-3])
    assert any(not torch.equal(v, snap.params[k]) for k, v in short_model.state_dict().items())


class _Counting(BaseEvaluator):
    def __init__(self) -> None:
        super().__init__()
        self.steps: list[int] = []
        self.primary_metric = "spearman"
        self.greater_is_better = True

    def __call__(self, model, output_path=None, epoch=-1, steps=-1):
        self.steps.append(steps)
        return {"sts-dev_spearman": float(len(self.steps))}


def test_stop_after_steps_evaluates_at_the_stopping_step(tiny_model, tiny_sentences, tmp_path):
    evaluator = _Counting()
    config = _config(tmp_path, "eval", eval_steps=3, stop_after_steps=2)
    result = train(tiny_model, pair_dataset(tiny_sentences), build_loss("mnrl", tiny_model), config,
                   evaluator=evaluator)
    assert result.steps == 2
    assert evaluator.steps == [2]  # step 2 is not a multiple of eval_steps, it is evaluated because training stops


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_stop_after_steps_rejects_bad_values(bad):
    with pytest.raises(ValueError, match="positive integer"):
        StopAfterSteps(bad)


@pytest.mark.parametrize(("kwargs", "fragment"), [
    ({"batch_size": 0}, "batch_size must be a positive integer, got 0"),
    ({"batch_size": 8.0}, "batch_size must be a positive integer, got 8.0"),
    ({"learning_rate": 0.0}, "learning_rate must be a positive number, got 0.0"),
    ({"learning_rate": float("nan")}, "learning_rate must be a positive number, got nan"),
    ({"epochs": 0}, "epochs must be a positive number, got 0"),
    ({"warmup_ratio": 1.0}, "warmup_ratio must be in [0, 1) (a share of the steps), got 1.0"),
    ({"warmup_ratio": -0.1}, "warmup_ratio must be in [0, 1)"),
    ({"max_steps": 0}, "max_steps must be a positive integer or -1 (use epochs), got 0"),
    ({"stop_after_steps": -2}, "stop_after_steps must be a non-negative integer (0 = off), got -2"),
    ({"eval_steps": 2.5}, "eval_steps must be a non-negative integer (0 = off), got 2.5"),
    ({"logging_steps": 0}, "logging_steps must be a positive integer, got 0"),
    ({"fp16": True, "bf16": True}, "fp16 and bf16 are exclusive"),
])
def test_train_config_rejects_bad_values_when_made(kwargs, fragment):
    with pytest.raises(ValueError, match="TrainConfig: ") as info:
        TrainConfig(**kwargs)
    assert fragment in str(info.value)


def test_two_bad_values_are_reported_together():
    with pytest.raises(ValueError) as info:
        TrainConfig(batch_size=-1, warmup_ratio=2.0)
    assert "batch_size must" in str(info.value) and "warmup_ratio must" in str(info.value)


@pytest.mark.parametrize(("ratio", "total", "warmup"), [(0.0, 100, 0), (0.1, 100, 10), (0.1, 40, 4), (0.25, 7, 2)])
def test_warmup_ratio_is_a_share_of_the_steps_without_a_deprecation_warning(ratio, total, warmup, tmp_path, caplog):
    import logging

    from st_hardneg.training import training_arguments

    with caplog.at_level(logging.WARNING):
        args = training_arguments(TrainConfig(output_dir=str(tmp_path), warmup_ratio=ratio), with_evaluator=False)
    assert args.get_warmup_steps(total) == warmup  # ceil(ratio * total), as the papers' warm-up share
    assert "deprecated" not in caplog.text
