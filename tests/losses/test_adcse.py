"""AdversarialNegativesLoss (AdCSE): loss value, EMA key encoder, adversary ascent, training-loop integration."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.optim.optimizer import register_optimizer_step_pre_hook

from st_hardneg.losses import stateful
from st_hardneg.losses.adcse import AdversarialNegativesLoss
from st_hardneg.training.callbacks import StatefulLossCallback

DIM = 32  # hidden size of the tiny model in conftest


def _features(model, sentences):
    return model.preprocess(sentences)


def _pairs(model, sentences):
    return [_features(model, sentences), _features(model, sentences)]


def _corpus(tiny_sentences, n=32):
    """n distinct short sentences (the fixture has 16)."""
    return [s if i < len(tiny_sentences) else f"{s[:-1]} again." for i, s in
            enumerate((tiny_sentences * (n // len(tiny_sentences) + 1))[:n])]


def _trainer(model, loss, tmp_path, sentences, callbacks=None, **overrides):
    from datasets import Dataset
    from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments

    kwargs = dict(output_dir=str(tmp_path), per_device_train_batch_size=8, learning_rate=1e-3, report_to=[],
                  seed=0, num_train_epochs=1, save_strategy="no", disable_tqdm=True, logging_steps=1)
    kwargs.update(overrides)
    args = SentenceTransformerTrainingArguments(**kwargs)
    dataset = Dataset.from_dict({"anchor": sentences, "positive": sentences})
    return SentenceTransformerTrainer(model=model, args=args, train_dataset=dataset, loss=loss, callbacks=callbacks)


def _optimizer_params(optimizer) -> set[int]:
    optimizer = stateful.unwrap_optimizer(optimizer)
    return {id(p) for group in optimizer.param_groups for p in group["params"]}


def _manual_loss(q, candidates, adversaries, temperature):
    """Independent cross-entropy: row i over [q_i·candidates, q_i·adversaries] / τ, target i."""
    q = F.normalize(q, dim=-1)
    cols = [F.normalize(candidates, dim=-1)]
    if adversaries is not None and adversaries.numel():
        cols.append(F.normalize(adversaries, dim=-1))
    logits = q @ torch.cat(cols).T / temperature
    return F.cross_entropy(logits, torch.arange(q.size(0)))


# ----------------------------------------------------------------------------- construction and input checks
@pytest.mark.parametrize(
    "kwargs",
    [
        {"num_adversaries": -1}, {"num_adversaries": 2.5}, {"num_adversaries": True}, {"num_adversaries": "8"},
        {"temperature": 0.0}, {"temperature": -0.05}, {"temperature": float("nan")},
        {"momentum": 1.0}, {"momentum": -0.1}, {"momentum": "high"},
        {"adversary_momentum": 1.0}, {"adversary_momentum": -0.5},
        {"adversary_lr": -1e-3}, {"adversary_lr": float("inf")}, {"adversary_weight_decay": -1.0},
        {"adversary_temperature": 0.0}, {"adversary_temperature": -1.0},
        {"untied": "yes"}, {"seed": 1.5},
    ],
)
def test_rejects_bad_arguments(tiny_model, kwargs):
    with pytest.raises(ValueError):
        AdversarialNegativesLoss(tiny_model, **kwargs)


def test_rejects_bad_batches(tiny_model, tiny_sentences):
    loss = AdversarialNegativesLoss(tiny_model, num_adversaries=4, seed=0)
    with pytest.raises(ValueError, match="at least 2 input columns"):
        loss([_features(tiny_model, tiny_sentences[:4])], None)
    # A single pair (the Trainer's last batch) is computed as sentence-transformers' MNRL computes it: without
    # adversaries its positive is its only candidate (loss 0, as MNRL's); with them it is the paper's Eq. 5 row (the
    # positive against the adversaries), with or without the in-batch keys (there are none to drop).
    one = [torch.randn(1, DIM), torch.randn(1, DIM)]
    no_adv = AdversarialNegativesLoss(tiny_model, num_adversaries=0)
    assert float(no_adv.compute_loss_from_embeddings(one, None)) == 0.0
    eq5 = AdversarialNegativesLoss(tiny_model, num_adversaries=4, seed=0, in_batch_keys=False)
    want = _manual_loss(one[0], one[1], eq5.adversaries, 0.05)
    torch.testing.assert_close(eq5.compute_loss_from_embeddings(one, None), want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(loss.compute_loss_from_embeddings(one, None), want, rtol=1e-5, atol=1e-6)


def test_key_encoder_is_exact_hidden_frozen_copy(tiny_model):
    loss = AdversarialNegativesLoss(tiny_model, seed=0)
    key = loss.key_encoder
    assert key is not tiny_model
    online_state, key_state = tiny_model.state_dict(), key.state_dict()
    assert online_state.keys() == key_state.keys()
    assert all(torch.equal(online_state[k], key_state[k]) for k in online_state)
    assert all(not p.requires_grad for p in key.parameters()) and key.training
    # Not a child module: no extra parameters (nothing for any optimizer), nothing for override_model_in_loss.
    # (The adversary bank is a child, but holds buffers only.)
    assert [name for name, _ in loss.named_children()] == ["model", "adversary_bank"]
    assert list(loss.adversary_bank.parameters()) == []
    assert {id(p) for p in loss.parameters()} == {id(p) for p in tiny_model.parameters()}
    assert {name for name, _ in loss.named_buffers() if not name.startswith("model.")} == {
        "adversary_bank.weight", "adversary_bank.velocity"}
    assert loss.adversaries is loss.adversary_bank.weight and loss.adversary_velocity is loss.adversary_bank.velocity
    assert loss.adversaries.shape == (64, DIM)
    # Seeded initialisation.
    assert torch.equal(AdversarialNegativesLoss(tiny_model, seed=0).adversaries, loss.adversaries)
    assert "AdCSE" in loss.citation and loss.get_config_dict()["num_adversaries"] == 64


# ----------------------------------------------------------------------------- the loss value
def test_loss_equals_cross_entropy_on_fixed_embeddings(tiny_model):
    torch.manual_seed(123)  # not the adversaries seed: data must not coincide with them
    loss = AdversarialNegativesLoss(tiny_model, num_adversaries=5, temperature=0.07, seed=1)
    q, k, neg = torch.randn(6, DIM), torch.randn(6, DIM), torch.randn(6, DIM)
    expected = _manual_loss(q, torch.cat([k, neg]), loss.adversaries, 0.07)
    with torch.no_grad():
        got = loss.compute_loss_from_embeddings([q, k, neg], None)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    stats = loss.diagnostics
    assert set(stats) == {"positive", "negative", "synthetic"}
    expected_synthetic = (F.normalize(q, dim=-1) @ F.normalize(loss.adversaries, dim=-1).T).mean()
    assert stats["synthetic"] == pytest.approx(float(expected_synthetic), abs=1e-6)
    assert loss.adversary_bank.pending_micro_batches == 0  # no_grad: nothing accumulated


def test_forward_uses_online_for_anchors_and_key_encoder_for_candidates(tiny_model, tiny_sentences):
    loss = AdversarialNegativesLoss(tiny_model, num_adversaries=3, seed=0)
    with torch.no_grad():  # make the key encoder visibly different from the online encoder
        for p in loss.key_encoder.parameters():
            p.add_(0.05 * torch.randn_like(p))
    features = _pairs(tiny_model, tiny_sentences[:6])
    torch.manual_seed(7)
    got = loss(features, None)
    features = _pairs(tiny_model, tiny_sentences[:6])
    torch.manual_seed(7)  # same dropout masks, consumed in the same order: online anchors, then key candidates
    with torch.no_grad():
        q = tiny_model(features[0])["sentence_embedding"]
        k = loss.key_encoder(features[1])["sentence_embedding"]
        k_online = tiny_model(_features(tiny_model, tiny_sentences[:6]))["sentence_embedding"]
    torch.testing.assert_close(got.detach(), _manual_loss(q, k, loss.adversaries, 0.05), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(k, k_online, atol=1e-3)
    assert got.requires_grad and loss.key_encoder.training


# ----------------------------------------------------------------------------- EMA key encoder
def test_ema_equals_closed_form_after_k_steps(tiny_model, tiny_sentences):
    m, steps = 0.6, 3
    loss = AdversarialNegativesLoss(tiny_model, num_adversaries=4, momentum=m, seed=0)
    theta0 = {n: p.detach().clone() for n, p in tiny_model.named_parameters()}
    optimizer = torch.optim.SGD(tiny_model.parameters(), lr=0.5, momentum=0.9)  # any optimizer
    online_after = []
    for step in range(steps):
        batch = tiny_sentences[4 * step: 4 * step + 8]
        optimizer.zero_grad()
        loss(_pairs(tiny_model, batch), None).backward()
        optimizer.step()
        online_after.append({n: p.detach().clone() for n, p in tiny_model.named_parameters()})
    assert loss.ema_updates == steps and loss.adversary_updates == steps
    key = dict(loss.key_encoder.named_parameters())
    changed = 0
    for name, p0 in theta0.items():
        expected = m**steps * p0 + (1 - m) * sum(m ** (steps - t) * online_after[t - 1][name]
                                                 for t in range(1, steps + 1))
        torch.testing.assert_close(key[name], expected, rtol=1e-5, atol=1e-6)
        changed += not torch.equal(online_after[-1][name], p0)
        assert key[name].grad is None and not key[name].requires_grad
    assert changed > 0


# ----------------------------------------------------------------------------- adversaries
def _adversary_step_reference(w, v, q, candidates, tau, lr, mu, wd):
    """One momentum-SGD ascent step of the loss computed from scratch (torch.optim.SGD convention)."""
    w_leaf = w.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(_manual_loss(q, candidates, w_leaf, tau), w_leaf)
    v = mu * v + (-grad + wd * w)
    return w - lr * v, v


def test_adversary_update_is_one_momentum_sgd_ascent_step(tiny_model):
    torch.manual_seed(123)  # not the adversaries seed: data must not coincide with them
    lr, mu, wd, tau_adv = 0.3, 0.9, 1e-2, 0.1  # τ_adv ≠ τ: the update must use adversary_temperature
    loss = AdversarialNegativesLoss(tiny_model, num_adversaries=6, adversary_lr=lr, adversary_momentum=mu,
                                    adversary_weight_decay=wd, adversary_temperature=tau_adv, seed=0)
    optimizer = torch.optim.SGD(tiny_model.parameters(), lr=0.0)
    w, v = loss.adversaries.clone(), torch.zeros_like(loss.adversaries)
    for _ in range(2):  # the second step checks the momentum buffer
        q, k = torch.randn(5, DIM, requires_grad=True), torch.randn(5, DIM)
        loss.compute_loss_from_embeddings([q, k], None).backward()
        optimizer.step()
        w, v = _adversary_step_reference(w, v, q.detach(), k, tau_adv, lr, mu, wd)
        torch.testing.assert_close(loss.adversaries, w, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(loss.adversary_velocity, v, rtol=1e-5, atol=1e-6)
    assert q.grad is not None  # the encoder side still gets its gradient
    assert loss.adversary_updates == 2


def test_adversary_gradient_accumulates_over_micro_batches_and_drops_skipped_windows(tiny_model):
    torch.manual_seed(123)  # not the adversaries seed: data must not coincide with them
    loss = AdversarialNegativesLoss(tiny_model, num_adversaries=4, adversary_lr=0.5, seed=0)
    optimizer = torch.optim.SGD(tiny_model.parameters(), lr=0.0)
    probe = next(tiny_model.parameters())
    batches = [(torch.randn(4, DIM), torch.randn(4, DIM)) for _ in range(3)]
    w0 = loss.adversaries.clone()

    def grad_of(q, k):
        w_leaf = w0.clone().requires_grad_(True)
        return torch.autograd.grad(_manual_loss(q, k, w_leaf, 0.05), w_leaf)[0]

    # A skipped step: gradients accumulated and backpropagated, then cleared without optimizer.step (what
    # GradScaler + zero_grad do).
    q0 = batches[0][0].clone().requires_grad_(True)
    (loss.compute_loss_from_embeddings([q0, batches[0][1]], None) + probe.sum() * 0).backward()
    assert probe.grad is not None
    optimizer.zero_grad()  # set_to_none
    # The next window: two micro-batches, then one step → the mean of their two gradients only.
    loss.compute_loss_from_embeddings(list(batches[1]), None)
    probe.grad = torch.zeros_like(probe)
    loss.compute_loss_from_embeddings(list(batches[2]), None)
    optimizer.step()
    mean_grad = (grad_of(*batches[1]) + grad_of(*batches[2])) / 2
    expected = w0 - 0.5 * (-mean_grad + 1e-4 * w0)
    torch.testing.assert_close(loss.adversaries, expected, rtol=1e-5, atol=1e-6)
    assert loss.adversary_updates == 1 and loss.ema_updates == 1


def test_grad_scaler_skipped_step_is_not_counted(tiny_model, tiny_sentences):
    loss = AdversarialNegativesLoss(tiny_model, num_adversaries=4, seed=0)
    optimizer = torch.optim.AdamW(tiny_model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu")
    key_before = [p.clone() for p in loss.key_encoder.parameters()]
    adversaries_before = loss.adversaries.clone()
    scaler.scale(loss(_pairs(tiny_model, tiny_sentences[:8]), None)).backward()
    next(tiny_model.parameters()).grad.fill_(float("inf"))
    scaler.step(optimizer)  # skipped: inf gradients
    scaler.update()
    assert loss.ema_updates == 0 and loss.adversary_updates == 0
    assert all(torch.equal(a, b) for a, b in zip(key_before, loss.key_encoder.parameters(), strict=True))
    assert torch.equal(adversaries_before, loss.adversaries)
    optimizer.zero_grad()
    scaler.scale(loss(_pairs(tiny_model, tiny_sentences[8:]), None)).backward()
    scaler.step(optimizer)
    scaler.update()
    assert loss.ema_updates == 1 and loss.adversary_updates == 1


def test_adversaries_move_toward_the_anchors(tiny_model):
    torch.manual_seed(123)  # not the adversaries seed: data must not coincide with them
    # Keys unrelated to the anchors, so that the adversaries get a non-negligible share of the softmax at τ = 0.05,
    # and a visible learning rate: the direction of the update is what is tested.
    loss = AdversarialNegativesLoss(tiny_model, num_adversaries=16, adversary_lr=0.5, seed=0)
    optimizer = torch.optim.SGD(tiny_model.parameters(), lr=0.0)
    anchors, keys = torch.randn(8, DIM), torch.randn(8, DIM)

    def mean_cos():
        return float((F.normalize(anchors, dim=-1) @ F.normalize(loss.adversaries, dim=-1).T).mean())

    history = [mean_cos()]
    for _ in range(5):
        loss.compute_loss_from_embeddings([anchors.clone().requires_grad_(True), keys], None).backward()
        optimizer.step()
        history.append(mean_cos())
    assert all(b > a for a, b in zip(history[:-1], history[1:], strict=True)), history
    assert history[-1] > history[0] + 0.01


# ----------------------------------------------------------------------------- ablations
def test_ablation_without_adversaries(tiny_model, tiny_sentences):
    loss = AdversarialNegativesLoss(tiny_model, num_adversaries=0)
    assert loss.adversaries.shape == (0, DIM) and loss.min_batch_size == 1  # one pair: MNRL's value
    q, k = torch.randn(6, DIM), torch.randn(6, DIM)
    torch.testing.assert_close(loss.compute_loss_from_embeddings([q, k], None), _manual_loss(q, k, None, 0.05))
    optimizer = torch.optim.SGD(tiny_model.parameters(), lr=0.1)
    loss(_pairs(tiny_model, tiny_sentences[:8]), None).backward()
    optimizer.step()
    assert loss.ema_updates == 1 and loss.adversary_updates == 0
    assert "synthetic" not in loss.diagnostics


def test_ablation_tied_encoders_is_simcse_plus_adversaries(tiny_model, tiny_sentences):
    loss = AdversarialNegativesLoss(tiny_model, num_adversaries=4, untied=False, seed=0)
    assert loss.key_encoder is None
    sentences = tiny_sentences[:6]
    tiny_model.eval()  # no dropout: keys are then exactly the online anchors
    with torch.no_grad():
        q = tiny_model.encode(sentences, convert_to_tensor=True)
        got = loss(_pairs(tiny_model, sentences), None)
    torch.testing.assert_close(got, _manual_loss(q, q, loss.adversaries, 0.05), rtol=1e-5, atol=1e-5)
    tiny_model.train()
    features = _pairs(tiny_model, sentences)
    loss(features, None).backward()
    assert all(p.grad is not None for p in tiny_model[0].model.encoder.parameters())
    torch.optim.SGD(tiny_model.parameters(), lr=0.1).step()
    assert loss.ema_updates == 0 and loss.adversary_updates == 1
    # Both ablations together: SimCSE = ST's MultipleNegativesRankingLoss with scale 1/τ.
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    both = AdversarialNegativesLoss(tiny_model, num_adversaries=0, untied=False)
    mnrl = MultipleNegativesRankingLoss(tiny_model, scale=20.0)
    tiny_model.eval()
    with torch.no_grad():
        torch.testing.assert_close(both(_pairs(tiny_model, sentences), None), mnrl(_pairs(tiny_model, sentences), None),
                                   rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- training loops
@pytest.fixture
def step_recorder():
    """Records every optimizer that steps (to check what they hold)."""
    seen = []
    handle = register_optimizer_step_pre_hook(lambda opt, args, kwargs: seen.append(opt))
    yield seen
    handle.remove()


def _assert_state_outside_optimizers(loss, optimizers):
    for optimizer in optimizers:
        ids = _optimizer_params(optimizer)
        assert not ids & {id(p) for p in loss.key_encoder.parameters()}
        assert id(loss.adversaries) not in ids and id(loss.adversary_velocity) not in ids
    assert all(p.grad is None for p in loss.key_encoder.parameters())


def test_update_counts_under_fit(tiny_model, tiny_sentences, tmp_path, monkeypatch, step_recorder):
    from sentence_transformers import InputExample
    from torch.utils.data import DataLoader

    monkeypatch.chdir(tmp_path)  # fit() picks a relative default output directory
    loss = AdversarialNegativesLoss(tiny_model, num_adversaries=8, seed=0)
    examples = [InputExample(texts=[s, s]) for s in tiny_sentences]
    tiny_model.fit(train_objectives=[(DataLoader(examples, batch_size=8), loss)], epochs=1, warmup_steps=0,
                   show_progress_bar=False)
    assert len(step_recorder) == 2
    assert loss.ema_updates == 2 and loss.adversary_updates == 2
    _assert_state_outside_optimizers(loss, step_recorder)


@pytest.mark.parametrize("optim", ["adamw_torch", "adamw_torch_fused"])
def test_update_counts_under_trainer_with_gradient_accumulation(tiny_model, tiny_sentences, tmp_path, optim,
                                                                 step_recorder):
    loss = AdversarialNegativesLoss(tiny_model, num_adversaries=8, seed=0)
    forwards = []
    loss.register_forward_hook(lambda module, args, output: forwards.append(float(output.detach())))
    trainer = _trainer(tiny_model, loss, tmp_path, _corpus(tiny_sentences, 32), gradient_accumulation_steps=2,
                       optim=optim)
    trainer.train()
    assert len(forwards) == 4 and trainer.state.global_step == 2 and len(step_recorder) == 2
    assert loss.ema_updates == 2 and loss.adversary_updates == 2
    _assert_state_outside_optimizers(loss, [trainer.optimizer])


def test_resume_gives_the_same_next_step_loss(tiny_model_dir, tiny_sentences, tmp_path):
    from st_hardneg.models import load_model

    sentences = _corpus(tiny_sentences, 32)  # 4 steps of 8

    def run(resume_from=None, seed=0):
        model = load_model(tiny_model_dir, pooling="cls", max_seq_length=32, device="cpu")
        # A fast EMA and fast adversaries, so that a key encoder / adversaries not restored would show.
        loss = AdversarialNegativesLoss(model, num_adversaries=8, momentum=0.5, adversary_lr=0.5, seed=seed)
        losses = []
        loss.register_forward_hook(lambda module, args, output: losses.append(float(output.detach())))
        trainer = _trainer(model, loss, tmp_path / "run", sentences, max_steps=4, save_strategy="steps",
                           save_steps=2, callbacks=[StatefulLossCallback(loss)])
        trainer.train(resume_from_checkpoint=resume_from)
        return model, loss, losses

    model_a, loss_a, losses_a = run()
    checkpoint = tmp_path / "run" / "checkpoint-2"
    saved = torch.load(checkpoint / "optimizer.pt", weights_only=True)["state"][stateful.STATE_KEY]
    assert saved["AdversarialNegativesLoss.0"]["ema_updates"] == 2
    # Other adversaries at construction: only the restore from the checkpoint can make the runs agree.
    model_b, loss_b, losses_b = run(resume_from=str(checkpoint), seed=1)
    assert len(losses_a) == 4 and len(losses_b) == 2
    assert losses_b == pytest.approx(losses_a[2:], rel=1e-6, abs=1e-7)
    assert loss_b.ema_updates == loss_a.ema_updates == 4 and loss_b.adversary_updates == 4
    torch.testing.assert_close(loss_b.adversaries, loss_a.adversaries)
    torch.testing.assert_close(loss_b.adversary_velocity, loss_a.adversary_velocity)
    for (name, pa), (_, pb) in zip(loss_a.key_encoder.state_dict().items(),
                                   loss_b.key_encoder.state_dict().items(), strict=True):
        torch.testing.assert_close(pb, pa, msg=name)
    for pa, pb in zip(model_a.parameters(), model_b.parameters(), strict=True):
        torch.testing.assert_close(pb, pa)


def test_loss_factory_is_seeded_by_the_trainer(tiny_model_dir, tiny_sentences, tmp_path):
    from st_hardneg.models import load_model

    adversaries = []
    for _ in range(2):
        model = load_model(tiny_model_dir, pooling="cls", max_seq_length=32, device="cpu")
        torch.manual_seed(len(adversaries))  # the global RNG state before the Trainer must not matter
        trainer = _trainer(model, lambda m: AdversarialNegativesLoss(m, num_adversaries=8), tmp_path, tiny_sentences)
        assert isinstance(trainer.loss, AdversarialNegativesLoss) and trainer.loss.model is model
        adversaries.append(trainer.loss.adversaries.clone())
    assert torch.equal(adversaries[0], adversaries[1])


def test_saved_model_is_the_online_encoder_only(tiny_model, tiny_sentences, tmp_path):
    from sentence_transformers import SentenceTransformer

    loss = AdversarialNegativesLoss(tiny_model, num_adversaries=8, seed=0)
    trainer = _trainer(tiny_model, loss, tmp_path / "train", tiny_sentences, max_steps=2)
    trainer.train()
    assert loss.ema_updates == 2
    out = tmp_path / "final"
    trainer.save_model(str(out))
    names = [p.relative_to(out).as_posix().lower() for p in out.rglob("*")]
    assert not [n for n in names if "key" in n or "adcse" in n or "advers" in n], names
    modules = (out / "modules.json").read_text()
    assert "st_hardneg" not in modules
    loaded = SentenceTransformer(str(out), device="cpu")
    assert sum(p.numel() for p in loaded.parameters()) == sum(p.numel() for p in tiny_model.parameters())
    tiny_model.eval()
    torch.testing.assert_close(loaded.encode(tiny_sentences[:4], convert_to_tensor=True),
                               tiny_model.encode(tiny_sentences[:4], convert_to_tensor=True))
    # ... and it is not the key encoder.
    key_emb = loss.key_encoder.eval().encode(tiny_sentences[:4], convert_to_tensor=True)
    assert not torch.allclose(key_emb, loaded.encode(tiny_sentences[:4], convert_to_tensor=True))


def test_custom_loop_checkpoint_round_trip(tiny_model_dir, tiny_sentences):
    """attach_optimizer before load_state_dict restores everything in a hand-written loop."""
    from st_hardneg.models import load_model

    def setup(seed):
        model = load_model(tiny_model_dir, pooling="cls", max_seq_length=32, device="cpu")
        loss = AdversarialNegativesLoss(model, num_adversaries=4, seed=seed)
        return model, loss, torch.optim.AdamW(model.parameters(), lr=1e-3)

    model, loss, optimizer = setup(0)
    for i in range(2):
        optimizer.zero_grad()
        loss(_pairs(model, tiny_sentences[8 * i: 8 * i + 8]), None).backward()
        optimizer.step()
    state = optimizer.state_dict()
    model2, loss2, optimizer2 = setup(5)
    model2.load_state_dict(model.state_dict())
    loss2.attach_optimizer(optimizer2)
    optimizer2.load_state_dict(state)
    assert loss2.ema_updates == 2 and stateful.STATE_KEY not in optimizer2.state
    torch.testing.assert_close(loss2.adversaries, loss.adversaries)
    for pa, pb in zip(loss.key_encoder.parameters(), loss2.key_encoder.parameters(), strict=True):
        torch.testing.assert_close(pb, pa)
    assert math.isfinite(float(loss2(_pairs(model2, tiny_sentences[:8]), None)))


def test_refuses_a_replaced_model(tiny_model, tiny_model_dir, tiny_sentences):
    from st_hardneg.models import load_model

    loss = AdversarialNegativesLoss(tiny_model, num_adversaries=2, seed=0)
    loss.model = load_model(tiny_model_dir, pooling="cls", max_seq_length=32, device="cpu")  # what model_init does
    with pytest.raises(RuntimeError, match="another model"):
        loss(_pairs(loss.model, tiny_sentences[:4]), None)


def test_step_listeners_do_not_outlive_their_loss(tiny_model):
    import gc

    loss = AdversarialNegativesLoss(tiny_model, num_adversaries=2, seed=0)
    assert loss in stateful._listeners
    count = len(stateful._listeners)
    del loss
    gc.collect()
    assert len(stateful._listeners) == count - 1
    torch.optim.SGD(tiny_model.parameters(), lr=0.1).step()  # the process-wide hook has nobody left to call


# ----------------------------------------------------------------------------- accumulation window
def test_two_forwards_then_one_backward_average_both_micro_batches(tiny_model):
    torch.manual_seed(123)
    lr, wd = 0.5, 1e-4
    loss = AdversarialNegativesLoss(tiny_model, num_adversaries=4, adversary_lr=lr, seed=0)
    optimizer = torch.optim.SGD(tiny_model.parameters(), lr=0.0)
    probe = next(tiny_model.parameters())
    w0 = loss.adversaries.clone()
    batches = [(torch.randn(4, DIM, requires_grad=True), torch.randn(4, DIM)) for _ in range(2)]
    outputs = [loss.compute_loss_from_embeddings(list(b), None) for b in batches]  # two forwards ...
    (outputs[0] + outputs[1] + probe.sum() * 0).backward()  # ... one backward (online grads appear only now)
    optimizer.step()

    def grad_of(q, k):
        w_leaf = w0.clone().requires_grad_(True)
        return torch.autograd.grad(_manual_loss(q.detach(), k, w_leaf, 0.05), w_leaf)[0]

    mean_grad = (grad_of(*batches[0]) + grad_of(*batches[1])) / 2
    torch.testing.assert_close(loss.adversaries, w0 - lr * (-mean_grad + wd * w0), rtol=1e-5, atol=1e-6)
    assert loss.adversary_updates == 1


# ----------------------------------------------------------------------------- paper Eq. 5
def test_in_batch_keys_false_is_paper_eq5(tiny_model):
    torch.manual_seed(7)
    tau, tau_adv, lr = 0.1, 0.2, 0.3
    loss = AdversarialNegativesLoss(tiny_model, num_adversaries=3, temperature=tau, adversary_temperature=tau_adv,
                                    adversary_lr=lr, adversary_momentum=0.0, adversary_weight_decay=0.0, seed=2,
                                    in_batch_keys=False)
    q, k, neg = torch.randn(4, DIM), torch.randn(4, DIM), torch.randn(4, DIM)

    def eq5(adversaries, t, with_neg):
        """-1/N Σ_i log e^{s(q_i,k_i)/τ} / (e^{s(q_i,k_i)/τ} [+ e^{s(q_i,neg_i)/τ}] + Σ_j e^{s(q_i,n_j)/τ})."""
        total = 0.0
        for i in range(q.size(0)):
            pos = torch.exp(F.cosine_similarity(q[i], k[i], dim=0) / t)
            den = pos + sum(torch.exp(F.cosine_similarity(q[i], a, dim=0) / t) for a in adversaries)
            if with_neg:
                den = den + torch.exp(F.cosine_similarity(q[i], neg[i], dim=0) / t)
            total = total - torch.log(pos / den)
        return total / q.size(0)

    with torch.no_grad():
        torch.testing.assert_close(loss.compute_loss_from_embeddings([q, k], None),
                                   eq5(loss.adversaries, tau, False), rtol=1e-5, atol=1e-5)
        # An explicit negative column: each anchor sees its own negative only.
        torch.testing.assert_close(loss.compute_loss_from_embeddings([q, k, neg], None),
                                   eq5(loss.adversaries, tau, True), rtol=1e-5, atol=1e-5)
    # The adversaries ascend Eq. 5 (at adversary_temperature), too.
    w0 = loss.adversaries.clone()
    loss.compute_loss_from_embeddings([q.clone().requires_grad_(True), k], None)
    torch.optim.SGD(tiny_model.parameters(), lr=0.0).step()
    w_leaf = w0.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(eq5(w_leaf, tau_adv, False), w_leaf)
    torch.testing.assert_close(loss.adversaries, w0 + lr * grad, rtol=1e-5, atol=1e-6)
    # Differs from the default denominator (with the other pairs' keys).
    default = AdversarialNegativesLoss(tiny_model, num_adversaries=3, temperature=tau, seed=2)
    with torch.no_grad():
        assert float(default.compute_loss_from_embeddings([q, k], None)) > float(eq5(w0, tau, False)) + 1e-3


# ----------------------------------------------------------------------------- the callback
def test_train_adds_the_stateful_loss_callback(tiny_model, tiny_sentences, tmp_path):
    from datasets import Dataset
    from transformers import TrainerCallback

    from st_hardneg.training import TrainConfig, train
    from st_hardneg.training.callbacks import add_stateful_loss_callback, find_stateful_losses

    loss = AdversarialNegativesLoss(tiny_model, num_adversaries=4, seed=0)
    seen = []

    class Spy(TrainerCallback):
        def on_step_begin(self, args, state, control, optimizer=None, **kwargs):
            seen.append(stateful.is_attached(loss, optimizer))  # before any step: only the callback attaches

    config = TrainConfig(output_dir=str(tmp_path), batch_size=8, max_steps=2, show_progress_bar=False,
                         save_checkpoints=False, logging_steps=1)
    result = train(tiny_model, Dataset.from_dict({"anchor": tiny_sentences, "positive": tiny_sentences}), loss,
                   config, callbacks=[Spy()])
    assert seen == [True, True] and result.steps == 2 and loss.ema_updates == 2
    # Found in a factory-built loss, a dict of losses, and a wrapping module; added only once.
    trainer = _trainer(tiny_model, lambda m: AdversarialNegativesLoss(m, num_adversaries=2), tmp_path, tiny_sentences)
    assert isinstance(add_stateful_loss_callback(trainer), StatefulLossCallback)
    assert add_stateful_loss_callback(trainer) is None
    assert find_stateful_losses({"a": loss, "b": torch.nn.Linear(2, 2)}) == [loss]
    assert find_stateful_losses(torch.nn.ModuleList([loss])) == [loss]
