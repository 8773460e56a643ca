"""AdversarialNegativesLoss on bad input: each case asserts the clear error, warning or exact result."""

from __future__ import annotations

import gc
import logging

import pytest
import torch
from torch import nn

from st_hardneg.losses import stateful
from st_hardneg.losses.adcse import AdversarialNegativesLoss
from st_hardneg.training.callbacks import StatefulLossCallback

DIM = 32


def _pairs(model, sentences):
    return [model.preprocess(sentences), model.preprocess(sentences)]


@pytest.mark.parametrize("kwargs, message", [
    ({"num_adversaries": True}, "non-negative integer"),
    ({"num_adversaries": -3}, "non-negative integer"),
    ({"momentum": 1.0}, r"momentum \(m"),
    ({"momentum": float("nan")}, r"momentum \(m"),
    ({"adversary_lr": float("nan")}, "adversary_lr must be a finite number >= 0"),
    ({"adversary_momentum": 1.0}, r"adversary_momentum must be a finite number in \[0, 1\)"),
    ({"untied": 1}, "untied must be True or False"),
    ({"in_batch_keys": "no"}, "in_batch_keys must be True or False"),
    ({"in_batch_keys": False, "num_adversaries": 0}, "needs num_adversaries > 0"),
    ({"adversary_temperature": float("inf")}, "adversary_temperature"),
])
def test_rejects_bad_arguments_with_a_clear_message(tiny_model, kwargs, message):
    with pytest.raises(ValueError, match=message):
        AdversarialNegativesLoss(tiny_model, **kwargs)


def test_eq5_single_pair_is_exact(tiny_model):
    """A batch of one pair: with M adversaries (Eq. 5) the loss is the exact cross-entropy over 1 + M logits."""
    loss = AdversarialNegativesLoss(tiny_model, num_adversaries=2, seed=0, in_batch_keys=False)
    q, k = torch.randn(1, DIM), torch.randn(1, DIM)
    n = nn.functional.normalize(loss.adversaries, dim=-1)
    qn, kn = nn.functional.normalize(q, dim=-1), nn.functional.normalize(k, dim=-1)
    logits = torch.cat([(qn * kn).sum(-1, keepdim=True), qn @ n.T], dim=1) / 0.05
    expected = torch.logsumexp(logits[0], 0) - logits[0, 0]
    with torch.no_grad():
        torch.testing.assert_close(loss.compute_loss_from_embeddings([q, k], None), expected, rtol=1e-5, atol=1e-5)


def test_swapped_model_is_refused(tiny_model, tiny_model_dir, tiny_sentences):
    from st_hardneg.models import load_model

    loss = AdversarialNegativesLoss(tiny_model, num_adversaries=2, seed=0)
    loss.model = load_model(tiny_model_dir, pooling="cls", max_seq_length=32, device="cpu")
    with pytest.raises(RuntimeError, match="another model than the one it was built for"):
        loss(_pairs(loss.model, tiny_sentences[:4]), None)


def _flat_parameter(model) -> nn.Parameter:
    flat = nn.Parameter(torch.cat([p.detach().flatten() for p in model.parameters()]))
    flat._is_flat_param = True  # what FSDP's FlatParameter carries
    return flat


def test_fsdp_like_flat_model_is_refused_in_forward(tiny_model, tiny_sentences):
    loss = AdversarialNegativesLoss(tiny_model, num_adversaries=2, seed=0)
    wrapper = nn.Module()
    wrapper.flat = _flat_parameter(tiny_model)
    loss.model = wrapper
    with pytest.raises(RuntimeError, match="flattened"):
        loss(_pairs(tiny_model, tiny_sentences[:4]), None)


def test_fsdp_like_flat_optimizer_step_raises_instead_of_never_updating(tiny_model, tiny_sentences):
    loss = AdversarialNegativesLoss(tiny_model, num_adversaries=2, seed=0)
    optimizer = torch.optim.SGD([_flat_parameter(tiny_model)], lr=0.1)
    loss(_pairs(tiny_model, tiny_sentences[:4]), None)  # a training forward is waiting for its step
    with pytest.raises(RuntimeError, match="FSDP / DeepSpeed ZeRO-3"):
        optimizer.step()
    assert loss.ema_updates == 0


def test_fsdp_like_flat_optimizer_is_refused_by_the_callback(tiny_model):
    loss = AdversarialNegativesLoss(tiny_model, num_adversaries=2, seed=0)
    callback = StatefulLossCallback(loss)
    with pytest.raises(RuntimeError, match="flattened"):
        callback.on_train_begin(None, _State(0), None, optimizer=torch.optim.SGD([_flat_parameter(tiny_model)], lr=1))
    with pytest.raises(RuntimeError, match="holds none of the online model's parameters"):
        callback.on_train_begin(None, _State(0), None, optimizer=torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=1))


class _State:
    def __init__(self, global_step):
        self.global_step = global_step


def test_callback_needs_a_stateful_loss(tiny_model):
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    with pytest.raises(ValueError, match="at least one stateful loss"):
        StatefulLossCallback(MultipleNegativesRankingLoss(tiny_model))


def test_state_of_another_configuration_is_refused(tiny_model):
    saved = AdversarialNegativesLoss(tiny_model, num_adversaries=2, seed=0).training_state_dict()
    other = AdversarialNegativesLoss(tiny_model, num_adversaries=3, seed=0)
    with pytest.raises(ValueError, match="was made with"):
        other.load_training_state_dict(saved)
    with pytest.raises(ValueError, match="state format"):
        other.load_training_state_dict({**saved, "format": 99})


def test_custom_loop_load_without_loss_state_warns(tiny_model, caplog):
    loss = AdversarialNegativesLoss(tiny_model, num_adversaries=2, seed=0)
    plain = torch.optim.AdamW(tiny_model.parameters(), lr=1e-3).state_dict()  # no st-hardneg entry
    optimizer = torch.optim.AdamW(tiny_model.parameters(), lr=1e-3)
    loss.attach_optimizer(optimizer)
    with caplog.at_level(logging.WARNING, logger="st_hardneg.losses.stateful"):
        optimizer.load_state_dict(plain)
    assert "holds no state for AdversarialNegativesLoss.0" in caplog.text


@pytest.mark.parametrize("save_only_model", [False, True])
def test_resume_without_loss_state_warns_that_it_restarts(tiny_model_dir, tiny_sentences, tmp_path, save_only_model):
    from datasets import Dataset
    from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments

    from st_hardneg.models import load_model

    def trainer(max_steps):
        model = load_model(tiny_model_dir, pooling="cls", max_seq_length=32, device="cpu")
        loss = AdversarialNegativesLoss(model, num_adversaries=4, seed=0)
        args = SentenceTransformerTrainingArguments(
            output_dir=str(tmp_path), per_device_train_batch_size=8, max_steps=max_steps, save_strategy="steps",
            save_steps=1, report_to=[], disable_tqdm=True, seed=0, save_only_model=save_only_model)
        data = Dataset.from_dict({"anchor": tiny_sentences, "positive": tiny_sentences})
        return loss, SentenceTransformerTrainer(model=model, args=args, train_dataset=data, loss=loss,
                                                callbacks=[StatefulLossCallback(loss)])

    trainer(1)[1].train()
    checkpoint = tmp_path / "checkpoint-1"
    if save_only_model:
        assert not (checkpoint / "optimizer.pt").exists()
    else:
        state = torch.load(checkpoint / "optimizer.pt", weights_only=True)
        del state["state"][stateful.STATE_KEY]  # a checkpoint whose loss entry was removed
        torch.save(state, checkpoint / "optimizer.pt")
    loss, resumed = trainer(2)
    with pytest.warns(RuntimeWarning, match="Resuming at step 1 without a saved AdversarialNegativesLoss state"):
        resumed.train(resume_from_checkpoint=str(checkpoint))
    assert loss.ema_updates == 1  # the restarted state took exactly the one remaining step


def test_state_met_only_at_the_first_step_is_restored_late_with_a_warning(tiny_model_dir, tiny_sentences, caplog):
    """Without the callback / attach_optimizer (e.g. model.fit), a checkpointed state comes back one step late."""
    from st_hardneg.models import load_model

    model = load_model(tiny_model_dir, pooling="cls", max_seq_length=32, device="cpu")
    loss = AdversarialNegativesLoss(model, num_adversaries=2, seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loss(_pairs(model, tiny_sentences[:4]), None).backward()
    optimizer.step()
    saved = optimizer.state_dict()
    assert loss.ema_updates == 1
    # a resumed run has no live loss of the first run: another live AdCSE loss of the same model would also listen
    # to optimizer2 and could claim the checkpointed slot first (listeners run in WeakSet order)
    del loss
    gc.collect()
    fresh = AdversarialNegativesLoss(model, num_adversaries=2, seed=1)
    optimizer2 = torch.optim.SGD(model.parameters(), lr=0.1)
    optimizer2.load_state_dict(saved)  # fresh has not met optimizer2: the entry waits in optimizer2.state
    assert fresh.ema_updates == 0 and stateful.STATE_KEY in optimizer2.state
    fresh(_pairs(model, tiny_sentences[4:8]), None).backward()
    with caplog.at_level(logging.WARNING, logger="st_hardneg.losses.stateful"):
        optimizer2.step()
    assert "only at the first optimizer step after resuming" in caplog.text
    assert fresh.ema_updates == 2 and stateful.STATE_KEY not in optimizer2.state
