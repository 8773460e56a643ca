"""``st_hardneg.training.loop``'s checks before any model loads: precision and the Hub, and the checkpoint a run
resumes from (the ``--training-arg`` converter's tests are in ``tests/cli/test_training_args.py``)."""

from __future__ import annotations

import json

import pytest

from st_hardneg.training.callbacks import CHECKPOINT_RUN_FILE
from st_hardneg.training.loop import check_hub_access, check_precision, find_checkpoint


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
