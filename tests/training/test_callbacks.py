"""``st_hardneg.training.callbacks``: the model card names st-hardneg (tag, version, documentation link) for an
st-hardneg loss only; a run's name, base model, data, evaluation (mteb's metric names) and command go into it; every
checkpoint records the run's loss."""

from __future__ import annotations

import json
from types import SimpleNamespace

from st_hardneg import __version__
from st_hardneg.training.callbacks import (
    CHECKPOINT_RUN_FILE,
    RUN_SECTION,
    CheckpointRunInfo,
    ModelCardCallback,
    add_card_evaluation,
    add_model_card_data,
    add_run_to_card,
    is_hub_name,
    mteb_metric_name,
    name_card,
)
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


# --------------------------------------------------------------------------- a run's identity in the card
def _run(base: str, **extra) -> dict:
    return {"model_name": "mixcse-scifact", "base_model": base,
            "training_data": {"name": "scifact", "size": 809, "description": "mined rows"}, "loss": "mixcse",
            "loss_call": "MixCSELoss(model, lam=0.3)", "loss_config": {"lam": 0.3, "partner": "shift"},
            "evaluation": {"scifact-test": {"ndcg_at_10": 0.6623, "mrr_at_10": 0.61}},
            "command": "st-hardneg train --task beir --data scifact --loss-arg lam=0.3", "version": __version__,
            **extra}


def test_a_saved_card_carries_the_name_base_data_evaluation_and_command(tiny_model, tiny_model_dir, tmp_path):
    import yaml
    from datasets import Dataset

    dataset = Dataset.from_dict({"anchor": ["a b"], "positive": ["b a"]})
    name_card(tiny_model, model_name="mixcse-scifact", base_model=str(tiny_model_dir), dataset=dataset,
              dataset_name="scifact")
    assert dataset.info.dataset_name == "scifact"  # what sentence-transformers' card reads when a Trainer is made
    entry = add_card_evaluation(tiny_model, "scifact-test", {"ndcg_at_10": 0.6623, "mrr_at_10": 0.61},
                                description="Information Retrieval", primary_metric="ndcg_at_10")
    assert entry is not None and entry.get_config_dict() == {}
    tiny_model.save(str(tmp_path / "saved"))
    add_run_to_card(tmp_path / "saved", _run(str(tiny_model_dir), model_changes=["--pooling mean: Pooling(cls) -> "
                                                                                 "Pooling(mean)"]))
    text = (tmp_path / "saved" / "README.md").read_text()
    header = yaml.safe_load(text.split("---")[1])
    assert "base_model" not in header  # a local path is no Hub id: named in the card's text only
    assert f"- **Base model:** `{tiny_model_dir}` (a local model)" in text and "[Unknown]" not in text
    assert "\n# mixcse-scifact\n" in text
    [result] = header["model-index"][0]["results"]
    assert result["dataset"]["type"] == "scifact-test"
    assert {m["type"]: m["value"] for m in result["metrics"]} == {"ndcg_at_10": 0.6623, "mrr_at_10": 0.61}
    section = text.split(RUN_SECTION, 1)[1]
    assert text.index(RUN_SECTION) < text.index("## Training Details")
    assert "- **Training data:** scifact, 809 rows (mined rows)" in section
    assert f"- **Base model:** `{tiny_model_dir}`\n  - --pooling mean: Pooling(cls) -> Pooling(mean)\n" in section
    assert "| scifact-test | 0.6623 | 0.6100 |" in section
    assert json.loads(section.split("```json\n", 1)[1].split("```")[0]) == {"lam": 0.3, "partner": "shift"}
    # written again (a resumed save): one section, the new one
    add_run_to_card(tmp_path / "saved", _run(str(tiny_model_dir), command="st-hardneg train --seed 1"))
    text = (tmp_path / "saved" / "README.md").read_text()
    assert text.count(RUN_SECTION) == 1 and "st-hardneg train --seed 1" in text and "lam=0.3\n" not in text


def test_a_hub_base_model_goes_into_the_cards_metadata(tiny_model, tmp_path):
    import yaml

    name_card(tiny_model, model_name="x", base_model="bert-base-uncased")
    tiny_model.save(str(tmp_path / "saved"))
    header = yaml.safe_load((tmp_path / "saved" / "README.md").read_text().split("---")[1])
    assert header["base_model"] == "bert-base-uncased"
    assert is_hub_name("sentence-transformers/all-MiniLM-L6-v2") and not is_hub_name(str(tmp_path))
    assert not is_hub_name("../models/x") and not is_hub_name("/abs/path")


def test_metric_names_are_mtebs():
    assert [mteb_metric_name(m) for m in ("ndcg@10", "mrr@10", "recall@100", "spearman")] == [
        "ndcg_at_10", "mrr_at_10", "recall_at_100", "cosine_spearman"]
