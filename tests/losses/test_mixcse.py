"""MixCSELoss against its equations, written out independently here (plain loops, no st_hardneg.functional)."""

from __future__ import annotations

import math

import pytest
import torch
from datasets import Dataset
from sentence_transformers import InputExample, SentenceTransformer, SentenceTransformerTrainer
from sentence_transformers import SentenceTransformerTrainingArguments as Args
from torch.utils.data import DataLoader

from st_hardneg import MixCSELoss
from st_hardneg.testing import two_way


def unit(v: torch.Tensor) -> torch.Tensor:
    return v / v.norm()


def row_ce(logits: list[float], target: int) -> float:
    m = max(logits)
    return -(logits[target] - m - math.log(sum(math.exp(x - m) for x in logits)))


def dot(a, b) -> float:
    return float((unit(a) * unit(b)).sum())


def reference_paper(h, hp, negs, lam, tau, partner, symmetric, focal_m=None):
    """The paper's loss, one anchor at a time."""
    n = h.size(0)

    def logit(c, positive):
        if focal_m is None:
            return c / tau
        return (c * c if positive else c * (c + focal_m)) / tau

    def direction(anchor, cands, source, extra):
        total = 0.0
        for i in range(n):
            j = partner(i, anchor, cands)
            mixed = unit(lam * unit(source[i]) + (1 - lam) * unit(source[j]))
            row = [logit(dot(anchor[i], cands[b]), b == i) for b in range(n)]
            row += [logit(dot(anchor[i], e), False) for e in extra]
            row.append(logit(dot(anchor[i], mixed), False))
            total += row_ce(row, i)
        return total / n

    forward = direction(h, hp, hp, list(negs))
    if not symmetric:
        return forward
    return (forward + direction(hp, h, h, [])) / 2


def reference_official(h, hp, lam, tau, symmetric):
    """The released code's N×3N layout with shift partners, zeroed (not removed) entries; like the released code it
    mixes the RAW vectors z2_b, z2_{b+1} (resp. z1_a, z1_{a+1}) and only the cosine normalises."""
    n = h.size(0)
    total = 0.0
    for a in range(n):
        row = [dot(h[a], hp[b]) / tau for b in range(n)]
        for b in range(n):
            mix_b = lam * hp[b] + (1 - lam) * hp[(b + 1) % n]
            row.append(0.0 if b == (a - 1) % n else dot(h[a], mix_b) / tau)
        if symmetric:
            mix_a = lam * h[a] + (1 - lam) * h[(a + 1) % n]
            for b in range(n):
                row.append(0.0 if b == (a + 1) % n else dot(mix_a, hp[b]) / tau)
        total += row_ce(row, a)
    return total / n


def shift(i, anchor, cands):
    return (i + 1) % anchor.size(0)


def hardest(i, anchor, cands):
    sims = [dot(anchor[i], cands[j]) if j != i else -9.0 for j in range(anchor.size(0))]
    return max(range(len(sims)), key=sims.__getitem__)


@pytest.fixture
def emb():
    g = torch.Generator().manual_seed(0)
    base = torch.randn(6, 8, generator=g)
    # positives near their anchors (dropout views), plus two explicit negatives per anchor in two columns
    return base, base + 0.3 * torch.randn(6, 8, generator=g), torch.randn(6, 8, generator=g), torch.randn(6, 8, generator=g)


DUMMY = torch.nn.Linear(1, 1)


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("stop_gradient", [True, False])
@pytest.mark.parametrize("lam", [0.0, 0.2, 0.7, 1.0])
def test_paper_layout_matches_equation(emb, symmetric, stop_gradient, lam):
    h, hp, *_ = emb
    loss = MixCSELoss(DUMMY, lam=lam, **two_way(symmetric), stop_gradient=stop_gradient)
    got = loss.compute_loss_from_embeddings([h, hp], None).item()
    want = reference_paper(h, hp, [], lam, 0.05, shift, symmetric)
    assert got == pytest.approx(want, rel=1e-5)


def test_paper_layout_with_explicit_negatives(emb):
    h, hp, n1, n2 = emb
    got = MixCSELoss(DUMMY, temperature=0.1, **two_way(True)).compute_loss_from_embeddings([h, hp, n1, n2], None).item()
    want = reference_paper(h, hp, [*n1, *n2], 0.2, 0.1, shift, True)
    assert got == pytest.approx(want, rel=1e-5)


def test_hardest_partner(emb):
    h, hp, *_ = emb
    got = MixCSELoss(DUMMY, partner="hardest", **two_way(True)).compute_loss_from_embeddings([h, hp], None).item()
    assert got == pytest.approx(reference_paper(h, hp, [], 0.2, 0.05, hardest, True), rel=1e-5)


def all_derangements(n):
    import itertools

    return [p for p in itertools.permutations(range(n)) if all(p[i] != i for i in range(n))]


def test_random_partner_is_a_seeded_derangement():
    """The loss equals the reference for exactly one derangement of the 6 rows (found by enumerating all 265, not by
    asking the implementation), the same one for the same seed, and the generator advances between batches.
    (3-dimensional embeddings, λ = 0.5 and τ = 0.5 make the 265 candidate losses distinguishable.)"""
    g = torch.Generator().manual_seed(0)
    h = torch.randn(6, 3, generator=g)
    hp = h + 0.3 * torch.randn(6, 3, generator=g)

    def make():
        return MixCSELoss(DUMMY, partner="random", seed=3, lam=0.5, temperature=0.5, **two_way(True))

    references = {p: reference_paper(h, hp, [], 0.5, 0.5, lambda i, *_, p=p: p[i], True) for p in all_derangements(6)}

    def matching(value):
        return [p for p, want in references.items() if want == pytest.approx(value, rel=2e-6)]

    seen = []
    loss = make()
    for _ in range(6):
        found = matching(loss.compute_loss_from_embeddings([h, hp], None).item())
        assert len(found) == 1  # a derangement (no anchor mixed with itself), and one we can name
        seen.append(found[0])
    assert len(set(seen)) > 1  # the draws advance from batch to batch
    assert matching(make().compute_loss_from_embeddings([h, hp], None).item()) == [seen[0]]


def test_mixcse_single_drops_only_the_reverse_mixed_negative(emb):
    """The paper's MixCSE_single: both InfoNCE directions, the forward mixed negative only."""
    h, hp, n1, _ = emb
    single = MixCSELoss(DUMMY, **two_way(True), reverse_mix=False).compute_loss_from_embeddings([h, hp, n1], None)
    n = h.size(0)
    forward = reference_paper(h, hp, list(n1), 0.2, 0.05, shift, False)
    reverse = 0.0
    for i in range(n):  # h'_i as the anchor over h_1..h_N, no mixed negative
        reverse += row_ce([dot(hp[i], h[b]) / 0.05 for b in range(n)], i)
    assert single.item() == pytest.approx((forward + reverse / n) / 2, rel=1e-5)
    # the old symmetric=False (one direction with its mix) stays reachable
    one_way = MixCSELoss(DUMMY, **two_way(False)).compute_loss_from_embeddings([h, hp, n1], None)
    assert one_way.item() == pytest.approx(forward, rel=1e-5)
    with pytest.raises(ValueError, match="reverse_mix"):
        MixCSELoss(DUMMY, **two_way(False), reverse_mix=True)
    assert MixCSELoss(DUMMY, reverse_mix=False).get_config_dict()["reverse_mix"] is False


@pytest.mark.parametrize(("layout", "partner"), [("paper", "shift"), ("paper", "hardest"), ("official", "shift")])
def test_bf16_autocast_equals_float32(emb, layout, partner):
    """Under bf16 autocast the loss math still runs in float32: same value (1e-6) and gradient as without autocast on
    the same (bf16-representable) embeddings, and the same hardest partners."""
    # realistic geometry (every embedding near a common direction, cosines ~0.95): the loss is O(1) and bf16 cosines
    # would move it by ~0.02
    g = torch.Generator().manual_seed(0)
    common = torch.randn(1, 64, generator=g)
    h = (common + 0.15 * torch.randn(32, 64, generator=g)).bfloat16().float()
    hp = (h + 0.05 * torch.randn(32, 64, generator=g)).bfloat16().float()
    values, grads = [], []
    for autocast in (False, True):
        hp_ = hp.clone().requires_grad_(True)
        loss = MixCSELoss(DUMMY, layout=layout, partner=partner)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            value = loss.compute_loss_from_embeddings([h, hp_], None)
        value.backward()
        values.append(value)
        grads.append(hp_.grad)
    assert values[1].dtype == torch.float32 and values[0].item() > 1.0
    assert values[1].item() == pytest.approx(values[0].item(), abs=1e-6)
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("symmetric", [True, False])
def test_official_layout_matches_released_code(emb, symmetric):
    h, hp, *_ = emb
    # the embeddings' norms differ from row to row, so mixing raw and mixing normalised vectors differ
    h, hp = h * torch.linspace(0.5, 3.0, 6).unsqueeze(1), hp * torch.linspace(2.0, 0.3, 6).unsqueeze(1)
    loss = MixCSELoss(DUMMY, layout="official", reverse_mix=symmetric)
    got = loss.compute_loss_from_embeddings([h, hp], None).item()
    assert got == pytest.approx(reference_official(h, hp, 0.2, 0.05, symmetric), rel=1e-5)
    # the released script's λ = 0.6 (run_unsup_example.sh: --lambdas 0.6)
    got = MixCSELoss(DUMMY, layout="official", lam=0.6, reverse_mix=symmetric).compute_loss_from_embeddings([h, hp], None)
    assert got.item() == pytest.approx(reference_official(h, hp, 0.6, 0.05, symmetric), rel=1e-5)
    # with unit-norm inputs raw and normalised mixing coincide (the numbers of earlier versions)
    hn, hpn = torch.nn.functional.normalize(h, dim=1), torch.nn.functional.normalize(hp, dim=1)
    got = MixCSELoss(DUMMY, layout="official", reverse_mix=symmetric).compute_loss_from_embeddings([hn, hpn], None)
    assert got.item() == pytest.approx(reference_official(hn, hpn, 0.2, 0.05, symmetric), rel=1e-5)


def test_official_layout_reverse_mix_controls_block_3(emb):
    h, hp, *_ = emb
    no_block3 = MixCSELoss(DUMMY, layout="official", reverse_mix=False).compute_loss_from_embeddings([h, hp], None)
    assert no_block3.item() == pytest.approx(reference_official(h, hp, 0.2, 0.05, False), rel=1e-5)


def test_official_layout_is_device_correct():
    """Partners, masks and logits live on the embeddings' device (the meta device has no data: any CPU index tensor
    mixed with it raises)."""
    h = torch.randn(6, 8, device="meta")
    for partner in ("shift", "random"):
        for layout in ("official", "paper"):
            loss = MixCSELoss(DUMMY, layout=layout, partner=partner)  # no generator exists on meta: global RNG
            value = loss.compute_loss_from_embeddings([h, h.clone()], None)
            assert value.device.type == "meta" and value.shape == ()


def test_official_layout_needs_a_permutation():
    with pytest.raises(ValueError, match="permutation"):
        MixCSELoss(DUMMY, layout="official", partner="hardest")


@pytest.mark.parametrize("layout", ["paper", "official"])
def test_stop_gradient_blocks_the_mix(emb, layout):
    """With λ=1 the mix is the positive itself: only the mixing path differs between sg and no-sg."""
    h, hp, *_ = emb

    def grad_of_positive(stop_gradient):
        hp_ = hp.clone().requires_grad_(True)
        loss = MixCSELoss(DUMMY, lam=0.5, reverse_mix=False, stop_gradient=stop_gradient, layout=layout)
        loss.compute_loss_from_embeddings([h, hp_], None).backward()
        return hp_.grad

    with_sg, without_sg = grad_of_positive(True), grad_of_positive(False)
    assert not torch.allclose(with_sg, without_sg)
    # with sg the gradient equals that of plain InfoNCE + a constant (detached) extra logit
    hp_ = hp.clone().requires_grad_(True)
    hn, hpn = torch.nn.functional.normalize(h, dim=1), torch.nn.functional.normalize(hp_, dim=1)
    with torch.no_grad():
        # the paper mixes normalised vectors, the released code ("official") the raw ones
        hpd = torch.nn.functional.normalize(hp, dim=1) if layout == "paper" else hp
        mix = torch.nn.functional.normalize(0.5 * hpd + 0.5 * hpd.roll(-1, 0), dim=1)
    if layout == "paper":
        extra = (hn * mix).sum(1, keepdim=True)
        logits = torch.cat([hn @ hpn.T, extra], 1) / 0.05
    else:
        block2 = hn @ mix.T
        block2 = block2.masked_fill(torch.eye(6, dtype=torch.bool).roll(-1, 1), 0.0)
        logits = torch.cat([hn @ hpn.T, block2], 1) / 0.05
        logits[:, 6:] = logits[:, 6:].masked_fill(torch.eye(6, dtype=torch.bool).roll(-1, 1), 0.0)
    torch.nn.functional.cross_entropy(logits, torch.arange(6)).backward()
    assert torch.allclose(with_sg, hp_.grad, atol=1e-5)


def reference_gradients(h, hp, lam, layout, stop_gradient, tau=0.05):
    """d loss / d h' of the one-directional loss (layout "paper") or the released code without block 3 ("official"),
    written with plain tensor ops and explicit loops, with or without detaching the mixes."""
    n = h.size(0)
    hp_ = hp.clone().requires_grad_(True)
    source = hp_.detach() if stop_gradient else hp_
    total = 0.0
    for a in range(n):
        row = [torch.dot(unit(h[a]), unit(hp_[b])) / tau for b in range(n)]
        if layout == "paper":
            mixed = unit(lam * unit(source[a]) + (1 - lam) * unit(source[(a + 1) % n]))
            row.append(torch.dot(unit(h[a]), mixed) / tau)
        else:
            for b in range(n):
                mixed = unit(lam * source[b] + (1 - lam) * source[(b + 1) % n])
                row.append(torch.zeros(()) if b == (a - 1) % n else torch.dot(unit(h[a]), mixed) / tau)
        logits = torch.stack(row)
        total = total - (logits[a] - torch.logsumexp(logits, 0))
    (total / n).backward()
    return hp_.grad


@pytest.mark.parametrize("layout", ["paper", "official"])
@pytest.mark.parametrize("stop_gradient", [True, False])
def test_stop_gradient_gradients_match_reference(emb, layout, stop_gradient):
    """The gradient into h' with and without sg equals an independent reference (mixes detached or not)."""
    h, hp, *_ = emb
    hp = hp * torch.linspace(0.5, 2.0, 6).unsqueeze(1)  # unequal norms: raw and normalised mixing differ
    hp_ = hp.clone().requires_grad_(True)
    loss = MixCSELoss(DUMMY, lam=0.5, reverse_mix=False, stop_gradient=stop_gradient, layout=layout)
    loss.compute_loss_from_embeddings([h, hp_], None).backward()
    torch.testing.assert_close(hp_.grad, reference_gradients(h, hp, 0.5, layout, stop_gradient), rtol=1e-4, atol=1e-6)
    other = reference_gradients(h, hp, 0.5, layout, not stop_gradient)
    assert (hp_.grad - other).abs().max() > 1e-3  # sg changes the gradient: the check above can fail


def test_mix_gradient_flows_without_stop_gradient(emb):
    h, hp, *_ = emb
    hp_ = hp.clone().requires_grad_(True)
    hn = torch.nn.functional.normalize(hp_, dim=1)
    loss = MixCSELoss(DUMMY, **two_way(False), stop_gradient=False)
    mixed_only = loss._mix(hn, hn[torch.tensor([1, 2, 3, 4, 5, 0])])
    assert mixed_only.requires_grad
    mixed_only[0].sum().backward()
    # d/dh' of sum(normalize(0.2 ĥ'_0 + 0.8 ĥ'_1)) by hand: only rows 0 and 1 receive a gradient
    ref = hp.clone().requires_grad_(True)
    unit(0.2 * unit(ref[0]) + 0.8 * unit(ref[1])).sum().backward()
    torch.testing.assert_close(hp_.grad, ref.grad, rtol=1e-4, atol=1e-6)
    assert hp_.grad[2:].abs().sum() == 0 and hp_.grad[:2].abs().sum() > 0
    assert not MixCSELoss(DUMMY)._mix(hn, hn[torch.tensor([1, 2, 3, 4, 5, 0])]).requires_grad


def test_focal_modulation_inside_mixcse(emb):
    h, hp, n1, _ = emb
    got = MixCSELoss(DUMMY, focal_m=0.3, **two_way(True)).compute_loss_from_embeddings([h, hp, n1], None).item()
    assert got == pytest.approx(reference_paper(h, hp, list(n1), 0.2, 0.05, shift, True, focal_m=0.3), rel=1e-5)


def test_mixed_negative_is_harder_than_random(emb):
    """Paper Eq. 2: once h_i ≈ h'_i, cos(h_i, mix_i) ≈ λ / sqrt(λ² + (1-λ)²) > cos(h_i, h'_j) ≈ 0."""
    g = torch.Generator().manual_seed(1)
    h = torch.nn.functional.normalize(torch.randn(64, 256, generator=g), dim=1)
    loss = MixCSELoss(DUMMY)
    loss.compute_loss_from_embeddings([h, h.clone()], None)
    d = loss.diagnostics
    assert d["positive"] == pytest.approx(1.0, abs=1e-5)
    assert abs(d["negative"]) < 0.02
    assert d["synthetic"] == pytest.approx(0.2 / math.sqrt(0.2**2 + 0.8**2), abs=0.03)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"lam": -0.1}, "lam"),
        ({"lam": 1.5}, "lam"),
        ({"lam": "x"}, "lam"),
        ({"temperature": 0}, "temperature"),
        ({"temperature": -1}, "temperature"),
        ({"partner": "next"}, "partner"),
        ({"layout": "mine"}, "layout"),
        ({"focal_m": -0.1}, "focal_m"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MixCSELoss(DUMMY, **kwargs)


def test_bad_inputs(emb):
    h, hp, *_ = emb
    loss = MixCSELoss(DUMMY)
    with pytest.raises(ValueError, match="at least 2 input columns"):
        loss.compute_loss_from_embeddings([h], None)
    with pytest.warns(UserWarning, match=r"a batch of 1 pair\(s\) is smaller than the 2 its equation needs"):
        assert float(loss.compute_loss_from_embeddings([h[:1], hp[:1]], None)) == 0.0  # skipped, never raised
    with pytest.raises(ValueError, match="same batch size"):
        loss.compute_loss_from_embeddings([h, hp[:3]], None)


@pytest.mark.parametrize("layout", ["paper", "official"])
def test_zero_vectors_and_bf16_stay_finite(emb, layout):
    h, hp, *_ = emb
    h = h.clone()
    h[0] = 0.0
    loss = MixCSELoss(DUMMY, layout=layout)
    assert torch.isfinite(loss.compute_loss_from_embeddings([h, hp], None))
    hb = h.bfloat16().requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        value = loss.compute_loss_from_embeddings([hb, hp.bfloat16()], None)
    value.backward()
    assert torch.isfinite(value) and torch.isfinite(hb.grad).all()


def test_config_and_citation():
    loss = MixCSELoss(DUMMY, lam=0.3, partner="random", seed=1)
    cfg = loss.get_config_dict()
    assert cfg["lam"] == 0.3 and cfg["partner"] == "random" and cfg["temperature"] == 0.05
    assert "Mixing Negatives" in loss.citation and loss.scale == pytest.approx(20.0)


# ------------------------------------------------------------------ training through sentence-transformers
def _weights(model):
    return torch.cat([p.detach().flatten().clone() for p in model.parameters()])


def test_legacy_fit_trains(tiny_model, tiny_sentences, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # fit() writes checkpoints/ into the working directory
    before = _weights(tiny_model)
    examples = [InputExample(texts=[s, s]) for s in tiny_sentences]
    loader = DataLoader(examples, batch_size=8, shuffle=True)
    loss = MixCSELoss(tiny_model, lam=0.2)
    tiny_model.fit(train_objectives=[(loader, loss)], epochs=1, warmup_steps=0, optimizer_params={"lr": 1e-3},
                   show_progress_bar=False)
    after = _weights(tiny_model)
    assert not torch.equal(before, after)
    assert set(loss.diagnostics) == {"positive", "negative", "synthetic"}


def test_trainer_trains_and_saved_model_loads_with_plain_st(tiny_model, tiny_sentences, tmp_path):
    before = _weights(tiny_model)
    ds = Dataset.from_dict({"anchor": tiny_sentences, "positive": tiny_sentences})
    loss = MixCSELoss(tiny_model)
    args = Args(output_dir=str(tmp_path / "out"), per_device_train_batch_size=8, num_train_epochs=2,
                learning_rate=1e-3, report_to=[], save_strategy="no", seed=0, logging_steps=1)
    trainer = SentenceTransformerTrainer(model=tiny_model, args=args, train_dataset=ds, loss=loss)
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert losses and all(math.isfinite(x) for x in losses)
    assert not torch.equal(before, _weights(tiny_model))
    tiny_model.save(str(tmp_path / "saved"))
    reloaded = SentenceTransformer(str(tmp_path / "saved"), device="cpu")
    a = tiny_model.encode(tiny_sentences[:3], convert_to_tensor=True)
    b = reloaded.encode(tiny_sentences[:3], convert_to_tensor=True)
    assert torch.allclose(a, b, atol=1e-5)
