"""Mined (explicit) negatives as the source of hardness: MixCSE partner="explicit", HNCSE hnm_pool, and the focal
modulation of explicit negatives, against hand-written losses."""

from __future__ import annotations

import warnings

import pytest
import torch

from st_hardneg import FocalInfoNCELoss, HNCSELoss, MixCSELoss
from st_hardneg.testing import ce, cosf, two_way, unit

TAU = 0.05


def triplets(n=5, d=8, num_negatives=1, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, d, generator=g, dtype=torch.float64)
    hp = h + 0.6 * torch.randn(n, d, generator=g, dtype=torch.float64)
    negs = [h + 1.2 * torch.randn(n, d, generator=g, dtype=torch.float64) for _ in range(num_negatives)]
    return [h, hp, *negs]


def explicit_mix_reference(cols, lam, symmetric, reverse_mix, skip_mix=()):
    """MixCSE with partner = the anchor's own first mined negative n_i:
    forward row i over [h'_1..h'_N, all explicit negatives, normalize(λ ĥ'_i + (1-λ) n̂_i)];
    reverse row i (h'_i as anchor) over [h_1..h_N, normalize(λ ĥ_i + (1-λ) n̂_i)]."""
    h, hp, negs = cols[0], cols[1], cols[2:]
    n = h.shape[0]
    total = 0.0
    for i in range(n):
        row = [cosf(h[i], hp[j]) / TAU for j in range(n)]
        row += [cosf(h[i], col[j]) / TAU for col in negs for j in range(n)]
        if i not in skip_mix:
            row.append(cosf(h[i], unit(lam * unit(hp[i]) + (1 - lam) * unit(negs[0][i]))) / TAU)
        forward = ce(row, i)
        if not symmetric:
            total += forward
            continue
        reverse_row = [cosf(hp[i], h[j]) / TAU for j in range(n)]
        if reverse_mix and i not in skip_mix:
            reverse_row.append(cosf(hp[i], unit(lam * unit(h[i]) + (1 - lam) * unit(negs[0][i]))) / TAU)
        total += (forward + ce(reverse_row, i)) / 2
    return total / n


@pytest.mark.parametrize("symmetric,reverse_mix", [(False, False), (True, True), (True, False)])
@pytest.mark.parametrize("num_negatives", [1, 2])
def test_mixcse_explicit_partner_equals_hand_built_mix(symmetric, reverse_mix, num_negatives):
    cols = triplets(num_negatives=num_negatives)
    loss = MixCSELoss(None, lam=0.3, partner="explicit", **two_way(symmetric), reverse_mix=reverse_mix)
    value = loss.compute_loss_from_embeddings(cols, None).item()
    assert value == pytest.approx(explicit_mix_reference(cols, 0.3, symmetric, reverse_mix), rel=1e-5)
    # and it is not the in-batch mix
    shift = MixCSELoss(None, lam=0.3, partner="shift", **two_way(symmetric), reverse_mix=reverse_mix)
    assert abs(shift.compute_loss_from_embeddings(cols, None).item() - value) > 1e-4
    assert loss.get_config_dict()["partner"] == "explicit"


def test_mixcse_explicit_partner_stop_gradient_detaches_the_mix():
    cols = [c.float().requires_grad_(True) for c in triplets()]
    MixCSELoss(None, partner="explicit", **two_way(False)).compute_loss_from_embeddings(cols, None).backward()
    with_sg = cols[2].grad.clone()
    for c in cols:
        c.grad = None
    MixCSELoss(None, partner="explicit", **two_way(False), stop_gradient=False).compute_loss_from_embeddings(
        cols, None).backward()
    # the negatives get a gradient as candidates either way, and an extra one through the mix without stop-gradient
    assert not torch.allclose(with_sg, cols[2].grad)


def test_mixcse_explicit_partner_that_is_a_false_negative_gives_no_mix():
    cols = triplets(seed=3)
    cols[2][1] = cols[1][1]  # the mined negative of pair 1 is a copy of its positive
    loss = MixCSELoss(None, lam=0.2, partner="explicit", **two_way(True))
    value = loss.compute_loss_from_embeddings(cols, None).item()
    # reference: that copy leaves row 1's denominator, and row 1 has no mixed negative in either direction
    h, hp, neg = cols
    n = h.shape[0]
    total = 0.0
    for i in range(n):
        row = [cosf(h[i], hp[j]) / TAU for j in range(n)]
        row += [cosf(h[i], neg[j]) / TAU for j in range(n) if not (i == 1 and j == 1)]
        reverse_row = [cosf(hp[i], h[j]) / TAU for j in range(n)]
        if i != 1:
            row.append(cosf(h[i], unit(0.2 * unit(hp[i]) + 0.8 * unit(neg[i]))) / TAU)
            reverse_row.append(cosf(hp[i], unit(0.2 * unit(h[i]) + 0.8 * unit(neg[i]))) / TAU)
        total += (ce(row, i) + ce(reverse_row, i)) / 2
    assert value == pytest.approx(total / n, rel=1e-5)


def test_mixcse_explicit_partner_needs_a_negative_column():
    with pytest.raises(ValueError, match="no negative column"):
        MixCSELoss(None, partner="explicit").compute_loss_from_embeddings(triplets()[:2], None)
    with pytest.raises(ValueError, match="permutation"):
        MixCSELoss(None, partner="explicit", layout="official")


@pytest.mark.parametrize("num_negatives", [1, 3])
def test_focal_modulates_explicit_negatives_like_in_batch_ones(num_negatives):
    cols = triplets(num_negatives=num_negatives, seed=5)
    m = 0.25
    h, hp, negs = cols[0], cols[1], cols[2:]
    n = h.shape[0]
    total = 0.0
    for i in range(n):
        s_p = cosf(h[i], hp[i])
        row = [s_p * s_p / TAU]
        row += [cosf(h[i], hp[j]) * (cosf(h[i], hp[j]) + m) / TAU for j in range(n) if j != i]
        row += [cosf(h[i], col[j]) * (cosf(h[i], col[j]) + m) / TAU for col in negs for j in range(n)]
        total += ce(row, 0)
    value = FocalInfoNCELoss(None, m=m).compute_loss_from_embeddings(cols, None).item()
    assert value == pytest.approx(total / n, rel=1e-5)
    # MixCSE's focal_m applies the same modulation to the explicit negatives (and its mix)
    mix_total = 0.0
    for i in range(n):
        s_p = cosf(h[i], hp[i])
        row = [s_p * s_p / TAU]
        row += [cosf(h[i], hp[j]) * (cosf(h[i], hp[j]) + m) / TAU for j in range(n) if j != i]
        row += [cosf(h[i], col[j]) * (cosf(h[i], col[j]) + m) / TAU for col in negs for j in range(n)]
        c = cosf(h[i], unit(0.2 * unit(hp[i]) + 0.8 * unit(negs[0][i])))
        row.append(c * (c + m) / TAU)
        mix_total += ce(row, 0)
    mixed = MixCSELoss(None, lam=0.2, partner="explicit", **two_way(False), focal_m=m)
    assert mixed.compute_loss_from_embeddings(cols, None).item() == pytest.approx(mix_total / n, rel=1e-5)


def test_hncse_hard_negative_pool_mixes_mined_negatives():
    cols = triplets(n=4, num_negatives=2, seed=7)
    h = cols[0]
    cands = torch.cat(cols[1:])
    n, k, m, seed = 4, 3, 6, 2
    loss = HNCSELoss(None, mode="hnm", k=k, num_mixed=m, hnm_pool="hard_negatives", seed=seed, alpha=0.7)
    value = loss.compute_loss_from_embeddings(cols, None).item()
    g = torch.Generator().manual_seed(seed)
    first = torch.randint(k, (n, m), generator=g)
    second = (first + torch.randint(1, k, (n, m), generator=g)) % k
    total = 0.0
    for i in range(n):
        pool = list(range(n, 3 * n))  # every explicit negative (shared candidates), never an in-batch positive
        top = sorted(pool, key=lambda c: -cosf(h[i], cands[c]))[:k]
        row = [cosf(h[i], cands[c]) / TAU for c in range(3 * n)]
        row += [cosf(h[i], unit(0.7 * unit(cands[top[a]]) + 0.3 * unit(cands[top[b]]))) / TAU
                for a, b in zip(first[i].tolist(), second[i].tolist(), strict=True)]
        total += ce(row, i)
    assert value == pytest.approx(total / n, rel=1e-5)


def test_hncse_pool_clamps_k_to_its_size_and_needs_negatives():
    cols = triplets(n=3, num_negatives=1)
    loss = HNCSELoss(None, mode="hnm", k=5, num_mixed=2, hnm_pool="hard_negatives", seed=0)
    with pytest.warns(UserWarning, match="HNM pool"):
        loss.compute_loss_from_embeddings(cols, None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loss.compute_loss_from_embeddings(cols, None)  # once per loss
    with pytest.raises(ValueError, match="no negative column"):
        HNCSELoss(None, mode="hnm", hnm_pool="hard_negatives").compute_loss_from_embeddings(cols[:2], None)
    with pytest.raises(ValueError, match="hnm_pool"):
        HNCSELoss(None, hnm_pool="mined")


def test_hncse_default_pool_ignores_explicit_negatives_for_mining():
    """in_batch_negatives (default): the mined negatives are candidates but never HNM parents, even when harder."""
    cols = triplets(n=4, num_negatives=1, seed=9)
    cols[2] = cols[0] + 0.05 * cols[2]  # mined negatives much harder than any in-batch one
    h, cands = cols[0], torch.cat(cols[1:])
    loss = HNCSELoss(None, mode="hnm", hnm_single=True, k=2)
    value = loss.compute_loss_from_embeddings(cols, None).item()
    total = 0.0
    for i in range(4):
        top = sorted([j for j in range(4) if j != i], key=lambda j: -cosf(h[i], cands[j]))[:2]
        row = [cosf(h[i], cands[c]) / TAU for c in range(8)] + [cosf(h[i], cands[j]) / TAU for j in top]
        total += ce(row, i)
    assert value == pytest.approx(total / 4, rel=1e-5)
