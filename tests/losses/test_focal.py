"""FocalInfoNCELoss and the focal modulation inside MixCSELoss, against formulas written out in the test."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils.data import DataLoader

from st_hardneg import FocalInfoNCELoss, MixCSELoss
from st_hardneg.testing import parameter_snapshot, parameters_changed, record_loss_values, two_way

TAU = 0.05
M = 0.3


# ---------------------------------------------------------------------------------------------- reference math
def cos(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Cosine of two vectors, written out."""
    return (a * b).sum() / (torch.sqrt((a * a).sum()) * torch.sqrt((b * b).sum()))


def unit(a: torch.Tensor) -> torch.Tensor:
    return a / torch.sqrt((a * a).sum())


def focal_row(s_pos: torch.Tensor, s_negs: list[torch.Tensor], tau: float, m: float) -> torch.Tensor:
    """Paper Eq. 2: -log( e^{s_p²/τ} / (e^{s_p²/τ} + Σ_n e^{s_n(s_n+m)/τ}) ), with explicit sums."""
    numerator = torch.exp(s_pos * s_pos / tau)
    denominator = numerator.clone()
    for s in s_negs:
        denominator = denominator + torch.exp(s * (s + m) / tau)
    return -torch.log(numerator / denominator)


def focal_direction(anchors, candidates, tau, m, extra=None):
    """Mean focal loss of anchor i against candidates (positive = candidates[i]) plus shared extra negatives
    and optional per-row extras (list of lists)."""
    n = anchors.shape[0]
    total = torch.zeros((), dtype=torch.float64)
    for i in range(n):
        negs = [cos(anchors[i], candidates[j]) for j in range(candidates.shape[0]) if j != i]
        if extra is not None:
            negs += [cos(anchors[i], e) for e in extra[i]]
        total = total + focal_row(cos(anchors[i], candidates[i]), negs, tau, m)
    return total / n


def embeddings(n=5, d=6, columns=2, seed=0, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    cols = [torch.randn(n, d, generator=g, dtype=torch.float64) for _ in range(columns)]
    # make the positives close to their anchors, as dropout views are
    cols[1] = cols[0] + 0.5 * cols[1]
    return [c.requires_grad_(requires_grad) for c in cols]


# ---------------------------------------------------------------------------------------------- Focal-InfoNCE
@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("columns", [2, 4])
def test_focal_matches_paper_formula(symmetric, columns):
    cols = embeddings(columns=columns)
    h, hp, negatives = cols[0], cols[1], cols[2:]
    loss = FocalInfoNCELoss(None, temperature=TAU, m=M, **two_way(symmetric))
    got = loss.compute_loss_from_embeddings(cols, None)

    # every explicit negative of every anchor is a shared candidate (ST's convention)
    explicit = [row for column in negatives for row in column]
    expected = focal_direction(h, hp, TAU, M, extra=[explicit] * len(h))
    if symmetric:
        # h'_i as the anchor, candidates h_1..h_N only
        expected = (expected + focal_direction(hp, h, TAU, M)) / 2
    assert got.item() == pytest.approx(expected.item(), rel=1e-5)


def test_focal_gradients_match_formula():
    h, hp = embeddings(requires_grad=True)
    FocalInfoNCELoss(None, temperature=0.1, m=0.2).compute_loss_from_embeddings([h, hp], None).backward()
    got = (h.grad.clone(), hp.grad.clone())
    h.grad = hp.grad = None
    focal_direction(h, hp, 0.1, 0.2).backward()
    torch.testing.assert_close(got[0].double(), h.grad, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(got[1].double(), hp.grad, rtol=1e-4, atol=1e-6)


def test_focal_diagnostics_and_config():
    h, hp = embeddings()
    loss = FocalInfoNCELoss(None, temperature=0.07, m=0.25, **two_way(True))
    assert loss.diagnostics == {}
    loss.compute_loss_from_embeddings([h, hp], None)
    n = h.shape[0]
    positive = sum(cos(h[i], hp[i]) for i in range(n)) / n
    negative = sum(cos(h[i], hp[j]) for i in range(n) for j in range(n) if i != j) / (n * (n - 1))
    assert loss.diagnostics["positive"] == pytest.approx(positive.item(), rel=1e-5)
    assert loss.diagnostics["negative"] == pytest.approx(negative.item(), rel=1e-5)
    assert "synthetic" not in loss.diagnostics
    assert loss.get_config_dict() == {"m": 0.25, "scale": 1 / 0.07, "temperature": 0.07, "similarity_fct": "cos_sim",
                                      "directions": ("query_to_doc", "doc_to_query"),
                                      "partition_mode": "per_direction", "hardness_mode": None,
                                      "hardness_strength": 0.0, "seed": None, "mask_duplicates": True,
                                      "margin": None, "margin_strategy": "absolute", "contrast_anchors": False,
                                      "contrast_positives": False, "gather_across_devices": False,
                                      "mini_batch_size": None, "mini_batch_num_tokens": None}
    assert "Focal-{InfoNCE}" in loss.citation
    assert loss.scale == pytest.approx(1 / 0.07)


@pytest.mark.parametrize("temperature", [0, -0.05, float("nan"), float("inf"), "warm"])
def test_focal_rejects_bad_temperature(temperature):
    with pytest.raises(ValueError, match="temperature"):
        FocalInfoNCELoss(None, temperature=temperature)


@pytest.mark.parametrize("m", [-0.1, float("nan"), float("inf"), None, "big"])
def test_focal_rejects_bad_margin(m):
    with pytest.raises(ValueError, match=r"^m \("):
        FocalInfoNCELoss(None, m=m)


def test_focal_rejects_bad_batches():
    loss = FocalInfoNCELoss(None)
    with pytest.raises(ValueError, match="at least 2 input columns"):
        loss.compute_loss_from_embeddings([torch.randn(4, 3)], None)
    # one pair (the Trainer's last batch): its positive is its only candidate, loss 0 as in sentence-transformers' MNRL
    assert float(loss.compute_loss_from_embeddings([torch.randn(1, 3), torch.randn(1, 3)], None)) == 0.0


def test_focal_bf16_autocast_is_finite():
    h, hp, neg = (c.float().bfloat16().requires_grad_() for c in embeddings(n=16, d=32, columns=3))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        value = FocalInfoNCELoss(None, **two_way(True)).compute_loss_from_embeddings([h, hp, neg], None)
    value.backward()
    assert torch.isfinite(value)
    assert all(torch.isfinite(t.grad).all() for t in (h, hp, neg))


@pytest.mark.parametrize("symmetric", [False, True])
def test_focal_bf16_autocast_equals_float32(symmetric):
    """Under bf16 autocast the loss math runs in float32: same loss (1e-6) and gradients as without autocast."""
    # realistic geometry (every embedding near a common direction, cosines ~0.95): the loss is O(1) and bf16 cosines
    # would move it by ~0.03
    g = torch.Generator().manual_seed(0)
    common = torch.randn(1, 64, generator=g)
    h = (common + 0.15 * torch.randn(32, 64, generator=g)).bfloat16().float()
    hp = (h + 0.05 * torch.randn(32, 64, generator=g)).bfloat16().float()
    neg = (common + 0.15 * torch.randn(32, 64, generator=g)).bfloat16().float()
    values, grads = [], []
    for autocast in (False, True):
        hp_ = hp.clone().requires_grad_(True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            value = FocalInfoNCELoss(None, **two_way(symmetric)).compute_loss_from_embeddings([h, hp_, neg], None)
        value.backward()
        values.append(value)
        grads.append(hp_.grad)
    assert values[0].item() > 1.0
    assert values[1].dtype == torch.float32 and values[1].item() == pytest.approx(values[0].item(), abs=1e-6)
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-5, atol=1e-7)


def test_focal_bf16_autocast_with_model(tiny_model, tiny_sentences):
    features = tiny_model.tokenize(tiny_sentences[:8])
    loss = FocalInfoNCELoss(tiny_model)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        value = loss([features, features], None)
    value.backward()
    assert torch.isfinite(value)


# ---------------------------------------------------------------------------------------------- focal in MixCSE
@pytest.mark.parametrize("symmetric", [False, True])
def test_mixcse_focal_matches_formula(symmetric):
    lam = 0.2
    cols = embeddings(columns=3)
    h, hp, neg = cols
    n = h.shape[0]
    loss = MixCSELoss(None, lam=lam, temperature=TAU, **two_way(symmetric), partner="shift", focal_m=M)
    got = loss.compute_loss_from_embeddings(cols, None)

    # forward: candidates h'_1..h'_N, the explicit negatives, and mix_i = normalize(λ ĥ'_i + (1-λ) ĥ'_{i+1 mod N})
    explicit = [row for row in neg]
    mixes = [unit(lam * unit(hp[i]) + (1 - lam) * unit(hp[(i + 1) % n])) for i in range(n)]
    expected = focal_direction(h, hp, TAU, M, extra=[explicit + [mixes[i]] for i in range(n)])
    if symmetric:
        reverse_mixes = [unit(lam * unit(h[i]) + (1 - lam) * unit(h[(i + 1) % n])) for i in range(n)]
        expected = (expected + focal_direction(hp, h, TAU, M, extra=[[reverse_mixes[i]] for i in range(n)])) / 2
    assert got.item() == pytest.approx(expected.item(), rel=1e-5)


def test_mixcse_focal_differs_from_plain_and_rejects_bad_margin():
    cols = embeddings()
    plain = MixCSELoss(None, **two_way(False)).compute_loss_from_embeddings(cols, None)
    focal = MixCSELoss(None, **two_way(False), focal_m=M).compute_loss_from_embeddings(cols, None)
    assert not torch.isclose(plain, focal)
    with pytest.raises(ValueError, match="focal_m"):
        MixCSELoss(None, focal_m=-0.5)


# ---------------------------------------------------------------------------------------------- training
def test_focal_trains_with_fit(tiny_model, tiny_sentences, tmp_path, monkeypatch):
    from sentence_transformers import InputExample

    monkeypatch.chdir(tmp_path)  # fit() writes its default checkpoint directory relative to the cwd
    examples = [InputExample(texts=[s, s]) for s in tiny_sentences]
    loader = DataLoader(examples, batch_size=8, shuffle=True)
    loss = FocalInfoNCELoss(tiny_model)
    values = record_loss_values(loss)
    before = parameter_snapshot(tiny_model)
    tiny_model.fit(train_objectives=[(loader, loss)], epochs=1, warmup_steps=0, show_progress_bar=False)
    assert values and all(math.isfinite(v) for v in values)
    assert parameters_changed(tiny_model, before)


def test_focal_trains_with_trainer(tiny_model, tiny_sentences, tmp_path):
    from datasets import Dataset
    from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments

    dataset = Dataset.from_dict({"anchor": tiny_sentences, "positive": tiny_sentences})
    args = SentenceTransformerTrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=8, num_train_epochs=1, learning_rate=1e-3,
        report_to=[], save_strategy="no", seed=0,
    )
    loss = FocalInfoNCELoss(tiny_model, **two_way(True))
    values = record_loss_values(loss)
    before = parameter_snapshot(tiny_model)
    trainer = SentenceTransformerTrainer(model=tiny_model, args=args, train_dataset=dataset, loss=loss)
    trainer.train()
    assert len(values) == 2 and all(math.isfinite(v) for v in values)
    assert math.isfinite(trainer.state.log_history[-1]["train_loss"])
    assert parameters_changed(tiny_model, before)
    assert set(loss.diagnostics) == {"positive", "negative"}
