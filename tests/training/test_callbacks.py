"""``st_hardneg.training.callbacks``: the model card names st-hardneg (tag, version, documentation link) for an
st-hardneg loss only, and every checkpoint records the run's loss."""

from __future__ import annotations

import json
from types import SimpleNamespace

from st_hardneg import __version__
from st_hardneg.training.callbacks import CHECKPOINT_RUN_FILE, CheckpointRunInfo, ModelCardCallback, add_model_card_data
from st_hardneg.training.registry import build_loss


def test_an_st_hardneg_loss_names_the_package_in_the_card(tiny_model, tmp_path):
    loss = build_loss("adcse", tiny_model)
    ModelCardCallback(loss).on_train_begin(None, None, None, model=tiny_model)
    card = tiny_model.model_card_data
    assert "st-hardneg" in card.tags and card.version["st_hardneg"] == __version__
    assert "https://st-hardneg.readthedocs.io/en/latest/losses/adcse.html" in card.citations["st-hardneg"]
    tiny_model.save(str(tmp_path / "saved"))
    text = (tmp_path / "saved" / "README.md").read_text()
    assert "- st-hardneg\n" in text.split("---")[1] and f"version = {{{__version__}}}" in text
    assert "AdversarialNegativesLoss: https://st-hardneg.readthedocs.io/en/latest/losses/adcse.html" in text


def test_another_loss_leaves_the_card_alone(tiny_model):
    loss = build_loss("mnrl", tiny_model)
    assert add_model_card_data(tiny_model, loss) is False
    assert "st-hardneg" not in tiny_model.model_card_data.tags
    assert "st-hardneg" not in tiny_model.model_card_data.citations
    assert add_model_card_data(tiny_model, {"a": loss, "b": build_loss("focal", tiny_model)}) is True
    assert "FocalInfoNCELoss: https://st-hardneg.readthedocs.io/en/latest/losses/focal.html" in \
        tiny_model.model_card_data.citations["st-hardneg"]


def test_every_checkpoint_records_the_loss(tmp_path):
    (tmp_path / "checkpoint-4").mkdir()
    info = {"loss": "focal", "loss_args": {"queue_size": 8}}
    args = SimpleNamespace(output_dir=str(tmp_path))
    state = SimpleNamespace(is_world_process_zero=True, global_step=4)
    CheckpointRunInfo(info).on_save(args, state, None)
    assert json.loads((tmp_path / "checkpoint-4" / CHECKPOINT_RUN_FILE).read_text()) == info
    state.global_step = 6  # no such checkpoint folder: nothing is written
    CheckpointRunInfo(info).on_save(args, state, None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-4"]
