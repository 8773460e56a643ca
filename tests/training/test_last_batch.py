"""A plain ``SentenceTransformerTrainer`` epoch whose last batch holds one pair (``dataloader_drop_last=False``, the
Trainer's default), for every loss; and the Trainer's ``model_init`` with the MNRL-equivalent AdCSE."""

from __future__ import annotations

import warnings

import pytest
import torch

from st_hardneg import AdversarialNegativesLoss, FocalInfoNCELoss, HNCSELoss, MixCSELoss

#: the losses, and whether a one-pair batch is skipped (its equation needs another row) or computed
LOSSES = {
    "mixcse": (lambda model: MixCSELoss(model, seed=0), True),
    "focal": (lambda model: FocalInfoNCELoss(model), False),
    "hncse": (lambda model: HNCSELoss(model, mode="both", k=2, num_mixed=2, seed=0), True),
    "adcse": (lambda model: AdversarialNegativesLoss(model, num_adversaries=4, seed=0), False),
}


def _args(tmp_path, **kwargs):
    from sentence_transformers import SentenceTransformerTrainingArguments

    return SentenceTransformerTrainingArguments(
        output_dir=str(tmp_path / "run"), per_device_train_batch_size=2, learning_rate=1e-3, report_to=[], seed=0,
        num_train_epochs=1, save_strategy="no", disable_tqdm=True, dataloader_drop_last=False, **kwargs)


@pytest.mark.parametrize("name", list(LOSSES))
def test_an_epoch_whose_last_batch_holds_one_pair_finishes(tiny_model, tiny_sentences, tmp_path, name):
    """5 pairs at batch size 2: the third step's batch is one pair. The epoch finishes (3 optimizer steps); a loss
    whose equation needs another row skips that batch with one warning (loss 0), the others compute it as MNRL
    would (0 for the lone positive of Focal-InfoNCE, the row against its adversaries for AdCSE)."""
    from datasets import Dataset
    from sentence_transformers import SentenceTransformerTrainer

    factory, skips = LOSSES[name]
    loss = factory(tiny_model)
    values: list[tuple[int, float]] = []
    loss.register_forward_hook(
        lambda module, args, output: values.append((len(args[0][0]["input_ids"]), float(output.detach()))))
    dataset = Dataset.from_dict({"anchor": tiny_sentences[:5], "positive": tiny_sentences[5:10]})
    trainer = SentenceTransformerTrainer(model=tiny_model, args=_args(tmp_path), train_dataset=dataset, loss=loss)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.train()
    assert trainer.state.global_step == 3
    assert [size for size, _ in values] == [2, 2, 1]
    skipped = [w for w in caught if "smaller than the" in str(w.message)]
    assert len(skipped) == (1 if skips else 0)
    last = values[-1][1]
    if skips:
        assert last == 0.0
    elif name == "focal":
        assert last == 0.0  # the positive alone: MNRL's value
    else:  # the row against its adversaries (its value is checked in tests/losses/test_sentence_transformers_paths)
        assert last >= 0.0 and torch.isfinite(torch.tensor(last))


def test_the_mnrl_equivalent_adcse_follows_model_init(tiny_model_dir, tiny_sentences, tmp_path):
    """``AdversarialNegativesLoss(num_adversaries=0, untied=False)`` keeps no key encoder, so the Trainer's
    ``model_init`` (which re-points ``loss.model`` to the model it makes) trains that model, as MNRL does; the
    untied loss, whose key encoder is the first model's copy, still refuses it in one line."""
    from datasets import Dataset
    from sentence_transformers import SentenceTransformerTrainer

    from st_hardneg.models import load_model

    def model_init():
        return load_model(tiny_model_dir, pooling="cls", max_seq_length=32, device="cpu")

    dataset = Dataset.from_dict({"anchor": tiny_sentences[:8], "positive": tiny_sentences[:8]})
    first = model_init()
    loss = AdversarialNegativesLoss(first, num_adversaries=0, untied=False)
    trainer = SentenceTransformerTrainer(model_init=model_init, args=_args(tmp_path), train_dataset=dataset,
                                         loss=loss)
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the guard's note that loss.model was re-pointed (model_init does it)
        trainer.train()
    assert trainer.state.global_step == 4
    trained = trainer.model
    assert loss.online_model is trained
    assert any(not torch.equal(before[k], v) for k, v in trained.state_dict().items())

    untied = AdversarialNegativesLoss(model_init(), num_adversaries=0)
    trainer = SentenceTransformerTrainer(model_init=model_init, args=_args(tmp_path), train_dataset=dataset,
                                         loss=untied)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(RuntimeError, match="model_init is not supported") as caught:
            trainer.train()
    assert "\n" not in str(caught.value)
