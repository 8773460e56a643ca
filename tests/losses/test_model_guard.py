"""st_hardneg.losses.model_guard: the model card of a model a loss is built on names st-hardneg (tag and version),
also in a plain SentenceTransformerTrainer run without st-hardneg's callbacks."""

from __future__ import annotations

import pytest
import torch

import st_hardneg
from st_hardneg import FocalInfoNCELoss, MixCSELoss
from st_hardneg.losses.model_guard import tag_model_card


def test_building_a_loss_tags_the_card_with_st_hardneg_and_its_version(tiny_model):
    assert "st-hardneg" not in tiny_model.model_card_data.tags
    MixCSELoss(tiny_model)
    FocalInfoNCELoss(tiny_model)  # a second loss adds nothing twice
    assert tiny_model.model_card_data.tags.count("st-hardneg") == 1
    assert tiny_model.model_card_data.version["st_hardneg"] == st_hardneg.__version__


def test_a_module_without_card_data_is_left_alone():
    module = torch.nn.Linear(2, 2)
    tag_model_card(module)
    assert not hasattr(module, "model_card_data")


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_plain_trainer_run_saves_a_card_that_names_st_hardneg(tiny_model, tiny_sentences, tmp_path):
    from datasets import Dataset
    from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments

    loss = MixCSELoss(tiny_model)
    args = SentenceTransformerTrainingArguments(str(tmp_path / "out"), per_device_train_batch_size=8, max_steps=1,
                                               report_to="none", save_strategy="no", use_cpu=True)
    train = Dataset.from_dict({"anchor": tiny_sentences, "positive": tiny_sentences})
    SentenceTransformerTrainer(model=tiny_model, args=args, train_dataset=train, loss=loss).train()
    tiny_model.save(str(tmp_path / "final"))
    card = (tmp_path / "final" / "README.md").read_text()
    assert "- st-hardneg" in card and "- loss:MixCSELoss" in card
    # the version stays in the card data (the card's template lists a fixed set of framework versions; the CLI's
    # ModelCardCallback writes it into the st-hardneg citation entry)
    assert tiny_model.model_card_data.version["st_hardneg"] == st_hardneg.__version__
