"""HNCSELoss against the paper's equations written out in the test with plain loops (not st_hardneg.functional)."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from torch.utils.data import DataLoader

from st_hardneg import HNCSELoss
from st_hardneg import functional as fn
from st_hardneg.testing import parameter_snapshot, parameters_changed, record_loss_values
from st_hardneg.testing.fixtures import hncse_positive_mixing, hncse_synthetic_negatives

TAU = 0.05
W1, W2 = 0.8, 0.2


# ---------------------------------------------------------------------------------------------- reference math
def cos(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a * b).sum() / (torch.sqrt((a * a).sum()) * torch.sqrt((b * b).sum()))


def unit(a: torch.Tensor) -> torch.Tensor:
    return a / torch.sqrt((a * a).sum())


def ref_positive_mixing(h, hp, threshold=0.1, w1=W1, w2=W2, single=False, detach=False, weight_gradient=False):
    """Paper Eq. 2 with the convex d1 <= d2 case and the d1 <= 0 / d1 + d2 <= 0 fallback, one anchor at a time.
    ``weight_gradient``: the d1 <= d2 weights d1/(d1+d2) are autograd tensors (the authors' code), else floats.

    Returns the list of p_i, the list of case names, and the list of j*."""
    n = h.shape[0]
    ps, cases, partners = [], [], []
    for i in range(n):
        sims = [cos(h[i], hp[j]).item() for j in range(n)]
        j_star = max((j for j in range(n) if j != i), key=lambda j: sims[j])
        d1, d2 = sims[i], sims[j_star]
        keep = unit(hp[i])
        source = hp.detach() if detach else hp
        if d1 <= 0 or d1 + d2 <= 0:
            case, p = "unsafe", keep
        elif d1 > d2:
            r = (d1 - d2) / d1
            if r <= threshold:
                case, p = "near", unit(w1 * unit(source[i]) + w2 * unit(source[j_star]))
            else:
                case, p = "far", keep
        else:
            case = "inverted"
            if weight_gradient:
                d1, d2 = cos(h[i], hp[i]), cos(h[i], hp[j_star])
            p = keep if single else unit(d1 / (d1 + d2) * unit(source[i]) + d2 / (d1 + d2) * unit(source[j_star]))
        ps.append(p)
        cases.append(case)
        partners.append(j_star)
    return ps, cases, partners


def ref_top_k(h, candidates, i, k):
    """The k in-batch negatives j != i most similar to anchor i, hardest first."""
    n = len(candidates)
    order = sorted((j for j in range(n) if j != i), key=lambda j: cos(h[i], candidates[j]).item(), reverse=True)
    return order[:k]


def ref_loss(h, positives, shared_negatives=(), extras=None, tau=TAU, focal_m=None):
    """Mean cross-entropy, target i, over [positives_1..N | shared negatives | extras[i]] with explicit sums;
    focal_m: positive s²/τ, negatives s(s+m)/τ."""
    n = h.shape[0]

    def logit(s, positive):
        if focal_m is None:
            return s / tau
        return s * s / tau if positive else s * (s + focal_m) / tau

    total = torch.zeros((), dtype=torch.float64)
    for i in range(n):
        pos = logit(cos(h[i], positives[i]), True)
        negs = [positives[j] for j in range(n) if j != i] + list(shared_negatives)
        negs += list(extras[i]) if extras is not None else []
        denominator = torch.exp(pos)
        for v in negs:
            denominator = denominator + torch.exp(logit(cos(h[i], v), False))
        total = total - (pos - torch.log(denominator))
    return total / n


def random_columns(n=6, d=8, columns=2, seed=0, requires_grad=False, noise=0.7):
    g = torch.Generator().manual_seed(seed)
    cols = [torch.randn(n, d, generator=g, dtype=torch.float64) for _ in range(columns)]
    cols[1] = cols[0] + noise * cols[1]
    return [c.requires_grad_(requires_grad) for c in cols]


def pm_scenario(d1: float, d2: float):
    """3 anchors in 6 dims: anchor 0 has cos(h_0, h'_0) = d1 and its hardest in-batch negative h'_1 at d2."""
    e = torch.eye(6, dtype=torch.float64)
    other = max(min(d1, d2) - 0.4, -0.95)  # h'_2 is less similar to h_0 than h'_1
    hp = torch.stack([
        d1 * e[0] + math.sqrt(1 - d1 * d1) * e[1],
        d2 * e[0] + math.sqrt(1 - d2 * d2) * e[2],
        other * e[0] + math.sqrt(1 - other * other) * e[3],
    ])
    h = torch.stack([e[0], hp[1] + 0.4 * e[4], hp[2] + 0.5 * e[5]])
    return h, hp


# ---------------------------------------------------------------------------------------------- positive mixing
PM_CASES = [
    # id, d1, d2, threshold, single, expected case of anchor 0, expected p_0 as (weight of h'_0, weight of h'_1)
    ("near", 0.8, 0.75, 0.1, False, "near", (W1, W2)),
    ("far", 0.8, 0.5, 0.1, False, "far", None),
    ("inverted", 0.5, 0.7, 0.1, False, "inverted", (0.5 / 1.2, 0.7 / 1.2)),
    ("inverted-single", 0.5, 0.7, 0.1, True, "inverted", None),
    ("near-single", 0.8, 0.75, 0.1, True, "near", (W1, W2)),
    ("d1-negative-below-d2", -0.2, 0.3, 0.1, False, "unsafe", None),
    ("d1-negative-above-d2", -0.2, -0.5, 0.1, False, "unsafe", None),
    ("d1-zero", 0.0, 0.4, 0.1, False, "unsafe", None),
    ("sum-nonpositive", 0.3, -0.5, 5.0, False, "unsafe", None),  # threshold 5 would otherwise make it "near"
    ("sum-positive-wide-threshold", 0.6, -0.3, 5.0, False, "near", (W1, W2)),
]


@pytest.mark.parametrize(("d1", "d2", "threshold", "single", "case", "weights"),
                         [c[1:] for c in PM_CASES], ids=[c[0] for c in PM_CASES])
def test_positive_mixing_cases(d1, d2, threshold, single, case, weights):
    h, hp = pm_scenario(d1, d2)
    # the construction hits the intended numbers
    assert cos(h[0], hp[0]).item() == pytest.approx(d1, abs=1e-9)
    assert cos(h[0], hp[1]).item() == pytest.approx(d2, abs=1e-9)
    ref_ps, ref_cases, ref_partners = ref_positive_mixing(h, hp, threshold, single=single)
    assert ref_partners[0] == 1 and ref_cases[0] == case

    loss = HNCSELoss(None, mode="pm", temperature=TAU, pm_threshold=threshold, w1=W1, w2=W2, pm_single=single)
    pm = hncse_positive_mixing(loss, h, hp)
    assert [fn.PM_CASES[c] for c in pm.cases.tolist()] == ref_cases
    assert pm.partners.tolist() == ref_partners
    expected_p0 = unit(hp[0]) if weights is None else unit(weights[0] * unit(hp[0]) + weights[1] * unit(hp[1]))
    torch.testing.assert_close(pm.positives[0].double(), expected_p0, rtol=1e-5, atol=1e-6)
    assert bool(pm.mixed[0]) == (weights is not None)
    for i in range(3):
        torch.testing.assert_close(pm.positives[i].double(), ref_ps[i], rtol=1e-5, atol=1e-6)

    got = loss.compute_loss_from_embeddings([h, hp], None)
    assert got.item() == pytest.approx(ref_loss(h, ref_ps).item(), rel=1e-5, abs=1e-6)
    mixed = sum(c == "near" or (c == "inverted" and not single) for c in ref_cases) / 3
    assert loss.diagnostics["pm_mixed"] == pytest.approx(mixed)


def test_positive_mixing_weights_function_directly():
    d1 = torch.tensor([0.8, 0.8, 0.5, -0.1, 0.3, 0.6])
    d2 = torch.tensor([0.75, 0.5, 0.7, 0.2, -0.4, 0.6])
    weights, cases, mixed = fn.positive_mixing_weights(d1, d2, 0.1, 3.0, 1.0)
    assert [fn.PM_CASES[c] for c in cases.tolist()] == ["near", "far", "inverted", "unsafe", "unsafe", "inverted"]
    torch.testing.assert_close(weights, torch.tensor([0.75, 1.0, 0.5 / 1.2, 1.0, 1.0, 0.5]))
    assert mixed.tolist() == [True, False, True, False, False, True]
    _, _, mixed_single = fn.positive_mixing_weights(d1, d2, 0.1, 3.0, 1.0, single=True)
    assert mixed_single.tolist() == [True, False, False, False, False, False]


def test_pm_replaces_positive_and_in_batch_negatives():
    """Random batch with a wide threshold so most rows mix; explicit negatives are shared and left unmixed."""
    h, hp, neg = random_columns(columns=3)
    ref_ps, ref_cases, _ = ref_positive_mixing(h, hp, threshold=10.0)
    assert ref_cases.count("near") + ref_cases.count("inverted") >= 3
    loss = HNCSELoss(None, mode="pm", pm_threshold=10.0)
    got = loss.compute_loss_from_embeddings([h, hp, neg], None)
    assert got.item() == pytest.approx(ref_loss(h, ref_ps, shared_negatives=list(neg)).item(), rel=1e-5, abs=1e-6)
    n = h.shape[0]
    assert loss.diagnostics["positive"] == pytest.approx(
        (sum(cos(h[i], ref_ps[i]) for i in range(n)) / n).item(), rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("pm_gradient", [True, False])
def test_pm_gradient_flow(pm_gradient):
    h, hp = random_columns(seed=3, requires_grad=True)
    # a threshold at the median r mixes about half of the rows, so both kinds of rows are checked
    n = h.shape[0]
    rs = []
    for i in range(n):
        sims = [cos(h[i], hp[j]).item() for j in range(n)]
        d1, d2 = sims[i], max(sims[j] for j in range(n) if j != i)
        rs.append((d1 - d2) / d1)
    ordered = sorted(rs)
    threshold = (ordered[n // 2 - 1] + ordered[n // 2]) / 2  # between two rows: no row sits on the boundary
    loss = HNCSELoss(None, mode="pm", pm_threshold=threshold, pm_gradient=pm_gradient)
    loss.compute_loss_from_embeddings([h, hp], None).backward()
    got_h, got_hp = h.grad.clone(), hp.grad.clone()
    h.grad = hp.grad = None
    ref_ps, ref_cases, _ = ref_positive_mixing(h, hp, threshold=threshold, detach=not pm_gradient)
    assert "near" in ref_cases and "far" in ref_cases
    ref_loss(h, ref_ps).backward()
    torch.testing.assert_close(got_h.double(), h.grad, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(got_hp.double(), hp.grad, rtol=1e-4, atol=1e-6)


def test_pm_gradient_off_blocks_the_mixed_rows():
    """Every row mixed and detached: no gradient reaches h' at all, only the anchors."""
    h, hp = random_columns(seed=3, requires_grad=True)
    _, ref_cases, _ = ref_positive_mixing(h, hp, threshold=1e6)
    if "unsafe" in ref_cases or "far" in ref_cases:
        pytest.skip("construction needs every row mixed")
    loss = HNCSELoss(None, mode="pm", pm_threshold=1e6, pm_gradient=False)
    loss.compute_loss_from_embeddings([h, hp], None).backward()
    assert hp.grad is None or torch.count_nonzero(hp.grad) == 0
    assert torch.count_nonzero(h.grad) > 0


# ---------------------------------------------------------------------------------------------- hard-negative mixing
def test_hnm_shapes_and_candidate_counts():
    h, hp = (fn.normalize(c) for c in random_columns(n=8, d=5))
    mixing = HNCSELoss(None, mode="hnm", k=4, num_mixed=7, seed=0)  # 7 of the 12 ordered pairs of 4
    assert hncse_synthetic_negatives(mixing, h, hp).shape == (8, 7, 5)
    with pytest.warns(UserWarning, match=r"num_mixed=7 but k=3 hard negatives make only 6 distinct ordered pairs"):
        clamped = HNCSELoss(None, mode="hnm", k=3, num_mixed=7, seed=0)
    assert hncse_synthetic_negatives(clamped, h, hp).shape == (8, 6, 5)
    single = HNCSELoss(None, mode="hnm", k=3, hnm_single=True)
    assert hncse_synthetic_negatives(single, h, hp).shape == (8, 3, 5)
    loss = HNCSELoss(None, mode="hnm", k=3, num_mixed=7, seed=0)
    loss.compute_loss_from_embeddings([h, hp], None)
    assert set(loss.diagnostics) == {"positive", "negative", "synthetic"}


def test_hnm_k2_even_mix_matches_formula():
    """k = 2 and α = 0.5: every sampled pair gives the same mixture, so the loss is deterministic."""
    h, hp, neg = random_columns(columns=3)
    n, m = h.shape[0], 2  # k = 2 has 2 ordered pairs: more would be clamped
    extras = []
    for i in range(n):
        a, b = ref_top_k(h, hp, i, 2)
        extras.append([unit(0.5 * unit(hp[a]) + 0.5 * unit(hp[b]))] * m)
    loss = HNCSELoss(None, mode="hnm", k=2, num_mixed=m, alpha=0.5)
    got = loss.compute_loss_from_embeddings([h, hp, neg], None)
    assert got.item() == pytest.approx(ref_loss(h, list(hp), list(neg), extras).item(), rel=1e-5, abs=1e-6)
    synthetic = sum(cos(h[i], extras[i][0]) for i in range(n)) / n
    assert loss.diagnostics["synthetic"] == pytest.approx(synthetic.item(), rel=1e-5, abs=1e-6)


def ref_adaptive(c):
    return (3 - c) / 4


@pytest.mark.parametrize("alpha", [0.5, 0.3, "adaptive", ref_adaptive])
def test_hnm_mixtures_are_pairs_of_top_k(alpha):
    """Every synthetic negative of anchor i is normalize(α Ĝ_a + (1-α) Ĝ_b) for distinct a, b in its top-k."""
    h, hp = random_columns(n=7, d=6, seed=1)
    k, m = 6, 30  # 30 draws = the 6 · 5 ordered pairs (7 rows: 6 in-batch negatives)
    weight = ref_adaptive if alpha == "adaptive" else alpha
    synthetic = hncse_synthetic_negatives(HNCSELoss(None, mode="hnm", k=k, num_mixed=m, alpha=alpha, seed=5), h, hp)
    for i in range(h.shape[0]):
        top = ref_top_k(h, hp, i, k)
        allowed = []
        for a in top:
            for b in top:
                if a != b:
                    w = weight(cos(hp[a], hp[b]).item()) if callable(weight) else weight
                    allowed.append(unit(w * unit(hp[a]) + (1 - w) * unit(hp[b])))
        allowed = torch.stack(allowed)
        for u in synthetic[i].double():
            assert torch.min((allowed - u).abs().amax(dim=1)) < 1e-5

    # and the loss uses these synthetic negatives as per-anchor extra candidates: mixtures built here by hand from the
    # hand-mined top-k and the documented pair draws of a generator seeded like the loss's
    first, second = redraw_pairs(5, h.shape[0], k, m)
    extras = []
    for i in range(h.shape[0]):
        top = ref_top_k(h, hp, i, k)
        row = []
        for o in range(m):
            a, b = top[int(first[i, o])], top[int(second[i, o])]
            w = weight(cos(hp[a], hp[b]).item()) if callable(weight) else weight
            row.append(unit(w * unit(hp[a]) + (1 - w) * unit(hp[b])))
        extras.append(row)
    torch.testing.assert_close(synthetic.double(), torch.stack([torch.stack(r) for r in extras]), rtol=1e-5, atol=1e-6)
    loss = HNCSELoss(None, mode="hnm", k=k, num_mixed=m, alpha=alpha, seed=5)
    got = loss.compute_loss_from_embeddings([h, hp], None)
    assert got.item() == pytest.approx(ref_loss(h, list(hp), extras=extras).item(), rel=1e-5, abs=1e-6)


def test_hnm_alpha_extremes_and_callables():
    h, hp = random_columns(n=6, d=5, seed=2)
    k = 3
    for alpha in [1.0, 0.0, lambda c: torch.ones_like(c)]:
        synthetic = hncse_synthetic_negatives(HNCSELoss(None, mode="hnm", k=k, num_mixed=6, alpha=alpha, seed=0), h, hp)
        for i in range(6):
            top = torch.stack([unit(hp[j]) for j in ref_top_k(h, hp, i, k)])
            for u in synthetic[i].double():
                assert torch.min((top - u).abs().amax(dim=1)) < 1e-6  # exactly one of the top-k
    # a callable returning a plain float works too
    synthetic = hncse_synthetic_negatives(HNCSELoss(None, mode="hnm", k=2, num_mixed=2, alpha=lambda c: 0.5), h, hp)
    a, b = ref_top_k(h, hp, 0, 2)
    torch.testing.assert_close(synthetic[0, 0].double(), unit(unit(hp[a]) + unit(hp[b])), rtol=1e-5, atol=1e-6)


def test_adaptive_alpha_formula():
    c = torch.tensor([-1.0, 0.0, 0.5, 1.0, 1.5])
    torch.testing.assert_close(fn.adaptive_alpha(c), torch.tensor([1.0, 0.75, 0.625, 0.5, 0.5]))


def test_sample_distinct_pairs_is_uniform_over_ordered_pairs():
    g = torch.Generator().manual_seed(0)
    first, second = fn.sample_distinct_pairs(3, 4, 4000, generator=g)
    assert first.shape == second.shape == (3, 4000)
    assert bool((first != second).all()) and int(first.min()) >= 0 and int(first.max()) <= 3
    counts = torch.zeros(4, 4)
    for a, b in zip(first.flatten().tolist(), second.flatten().tolist(), strict=True):
        counts[a, b] += 1
    expected = 12000 / 12
    off = ~torch.eye(4, dtype=torch.bool)
    assert counts[~off].sum() == 0
    assert ((counts[off] - expected).abs() < 0.1 * expected).all()
    with pytest.raises(ValueError, match="k >= 2"):
        fn.sample_distinct_pairs(2, 1, 3)


@pytest.mark.parametrize("focal_m", [None, 0.3])
def test_hnm_single_uses_top_k_themselves(focal_m):
    h, hp, neg = random_columns(columns=3, seed=4)
    k = 3
    extras = [[unit(hp[j]) for j in ref_top_k(h, hp, i, k)] for i in range(h.shape[0])]
    loss = HNCSELoss(None, mode="hnm", k=k, hnm_single=True, focal_m=focal_m)
    torch.testing.assert_close(hncse_synthetic_negatives(loss, fn.normalize(h), fn.normalize(hp)).double(),
                               torch.stack([torch.stack(e) for e in extras]), rtol=1e-5, atol=1e-6)
    got = loss.compute_loss_from_embeddings([h, hp, neg], None)
    expected = ref_loss(h, list(hp), list(neg), extras, focal_m=focal_m)
    assert got.item() == pytest.approx(expected.item(), rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("focal_m", [None, 0.2])
def test_mode_both_composes_pm_then_hnm(focal_m):
    """PM rewrites the in-batch candidates; HNM mines its top-k among the rewritten p_j and mixes those."""
    h, hp, neg = random_columns(columns=3, seed=6)
    ref_ps, ref_cases, _ = ref_positive_mixing(h, hp, threshold=10.0)
    assert ref_cases.count("near") + ref_cases.count("inverted") >= 2
    m = 2
    extras = []
    for i in range(h.shape[0]):
        a, b = ref_top_k(h, ref_ps, i, 2)
        extras.append([unit(0.5 * ref_ps[a] + 0.5 * ref_ps[b])] * m)
    loss = HNCSELoss(None, mode="both", pm_threshold=10.0, k=2, num_mixed=m, focal_m=focal_m)
    got = loss.compute_loss_from_embeddings([h, hp, neg], None)
    assert got.item() == pytest.approx(ref_loss(h, ref_ps, list(neg), extras, focal_m=focal_m).item(), rel=1e-5, abs=1e-6)
    assert set(loss.diagnostics) == {"positive", "negative", "synthetic", "pm_mixed"}


def test_focal_inside_hncse_pm_matches_formula():
    h, hp = random_columns(seed=8)
    ref_ps, _, _ = ref_positive_mixing(h, hp, threshold=10.0)
    loss = HNCSELoss(None, mode="pm", pm_threshold=10.0, focal_m=0.3)
    got = loss.compute_loss_from_embeddings([h, hp], None)
    assert got.item() == pytest.approx(ref_loss(h, ref_ps, focal_m=0.3).item(), rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("hnm_gradient", [True, False])
def test_hnm_gradient_flow(hnm_gradient):
    h, hp = random_columns(seed=9, requires_grad=True)
    loss = HNCSELoss(None, mode="hnm", k=2, num_mixed=2, hnm_gradient=hnm_gradient)
    loss.compute_loss_from_embeddings([h, hp], None).backward()
    got_h, got_hp = h.grad.clone(), hp.grad.clone()
    h.grad = hp.grad = None
    source = hp if hnm_gradient else hp.detach()
    extras = []
    for i in range(h.shape[0]):
        a, b = ref_top_k(h, hp, i, 2)
        extras.append([unit(0.5 * unit(source[a]) + 0.5 * unit(source[b]))] * 2)
    ref_loss(h, list(hp), extras=extras).backward()
    torch.testing.assert_close(got_h.double(), h.grad, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(got_hp.double(), hp.grad, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("pm_weight_gradient", [True, False])
def test_pm_weight_gradient_matches_autograd_through_the_weights(pm_weight_gradient):
    """pm_weight_gradient=True differentiates through d1/(d1+d2) of the inverted rows, as the authors' code does;
    checked against a reference whose weights are autograd tensors (or floats)."""
    h, hp = random_columns(seed=3, requires_grad=True, noise=2.0)
    _, cases, _ = ref_positive_mixing(h, hp, threshold=0.1)
    assert "inverted" in cases  # the weights only carry a gradient in this case
    loss = HNCSELoss(None, mode="pm", pm_weight_gradient=pm_weight_gradient)
    loss.compute_loss_from_embeddings([h, hp], None).backward()
    got = h.grad.clone(), hp.grad.clone()
    h.grad = hp.grad = None
    ps, _, _ = ref_positive_mixing(h, hp, threshold=0.1, weight_gradient=pm_weight_gradient)
    ref_loss(h, ps).backward()
    torch.testing.assert_close(got[0].double(), h.grad, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(got[1].double(), hp.grad, rtol=1e-4, atol=1e-6)
    h.grad = hp.grad = None
    ps, _, _ = ref_positive_mixing(h, hp, threshold=0.1, weight_gradient=not pm_weight_gradient)
    ref_loss(h, ps).backward()
    assert (got[0].double() - h.grad).abs().max() > 1e-4  # the option changes the gradient
    assert HNCSELoss(None, pm_weight_gradient=True).get_config_dict()["pm_weight_gradient"] is True


def redraw_pairs(seed, n, k, m):
    """The documented sampling scheme written out: a uniform in [0, k), b = (a + o) mod k with o uniform in [1, k),
    from a generator seeded like the loss's."""
    g = torch.Generator().manual_seed(seed)
    first = torch.randint(k, (n, m), generator=g)
    second = (first + torch.randint(1, k, (n, m), generator=g)) % k
    return first, second


@pytest.mark.parametrize("alpha", [0.3, ref_adaptive])
def test_hnm_loss_with_hand_built_mixtures(alpha):
    """The HNM loss against mixtures built in the test from the hand-mined top-k and the re-drawn pairs."""
    h, hp, neg = random_columns(n=7, d=6, seed=1, columns=3)
    k, m, seed = 4, 5, 11
    first, second = redraw_pairs(seed, 7, k, m)
    extras = []
    for i in range(7):
        top = ref_top_k(h, hp, i, k)
        row = []
        for o in range(m):
            a, b = top[int(first[i, o])], top[int(second[i, o])]
            w = alpha(cos(hp[a], hp[b]).item()) if callable(alpha) else alpha
            row.append(unit(w * unit(hp[a]) + (1 - w) * unit(hp[b])))
        extras.append(row)
    loss = HNCSELoss(None, mode="hnm", k=k, num_mixed=m, alpha=alpha, seed=seed)
    got = loss.compute_loss_from_embeddings([h, hp, neg], None)
    assert got.item() == pytest.approx(ref_loss(h, list(hp), list(neg), extras).item(), rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("mode", ["pm", "hnm", "both"])
def test_bf16_autocast_equals_float32(mode):
    """Under bf16 autocast the loss math runs in float32: the same loss (1e-6) and the same PM partners and cases as
    without autocast, on the same bf16-representable embeddings."""
    # realistic geometry: every embedding near a common direction, in-batch cosines ~0.95 with small gaps (bf16
    # cosines are only resolved to 0.004 there: computed in bf16, about half of the hardest partners change)
    g = torch.Generator().manual_seed(0)
    common = torch.randn(1, 64, generator=g)
    h = (common + 0.15 * torch.randn(64, 64, generator=g)).bfloat16().float()
    hp = (h + 0.05 * torch.randn(64, 64, generator=g)).bfloat16().float()
    neg = (common + 0.15 * torch.randn(64, 64, generator=g)).bfloat16().float()
    results = []
    for autocast in (False, True):
        loss = HNCSELoss(None, mode=mode, k=4, num_mixed=8, pm_threshold=0.3, alpha="adaptive", seed=0)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            value = loss.compute_loss_from_embeddings([h, hp, neg], None)
            pm = hncse_positive_mixing(loss, h, hp)
        results.append((value, pm))
    (v32, pm32), (v16, pm16) = results
    assert v16.dtype == torch.float32 and v16.item() == pytest.approx(v32.item(), abs=1e-6)
    assert torch.equal(pm16.partners, pm32.partners) and torch.equal(pm16.cases, pm32.cases)


# ---------------------------------------------------------------------------------------------- k, batch size, seeds
def test_k_larger_than_batch_is_clamped_with_one_warning():
    h, hp = random_columns(n=5)
    loss = HNCSELoss(None, mode="hnm", k=10, hnm_single=True)
    with pytest.warns(UserWarning, match=r"k=10 .* using k=4"):
        loss.compute_loss_from_embeddings([h, hp], None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loss.compute_loss_from_embeddings([h, hp], None)  # warned once per loss
        assert loss.effective_k(5) == 4
        assert hncse_synthetic_negatives(loss, h, hp).shape[1] == 4
    extras = [[unit(hp[j]) for j in ref_top_k(h, hp, i, 4)] for i in range(5)]
    got = loss.compute_loss_from_embeddings([h, hp], None)
    assert got.item() == pytest.approx(ref_loss(h, list(hp), extras=extras).item(), rel=1e-5, abs=1e-6)
    # k == batch size - 1 is not clamped
    exact = HNCSELoss(None, mode="hnm", k=4, hnm_single=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        exact.compute_loss_from_embeddings([h, hp], None)


def test_mixing_needs_three_pairs():
    h, hp = random_columns(n=2)
    # a smaller batch (the Trainer's last one) is skipped with one warning per loss: loss 0, never an exception
    for mode in ("hnm", "both"):
        with pytest.warns(UserWarning, match=r"a batch of 2 pair\(s\) is smaller than the 3 its equation needs"):
            assert float(HNCSELoss(None, mode=mode).compute_loss_from_embeddings([h, hp], None)) == 0.0
    with pytest.warns(UserWarning):
        value = HNCSELoss(None, mode="hnm", hnm_single=True).compute_loss_from_embeddings([h, hp], None)
    assert torch.isfinite(value)
    assert torch.isfinite(HNCSELoss(None, mode="pm").compute_loss_from_embeddings([h, hp], None))


def test_seeded_runs_are_reproducible():
    h, hp = random_columns(n=8)

    def run(seed, steps=2):
        loss = HNCSELoss(None, mode="hnm", k=5, num_mixed=6, seed=seed)
        return [loss.compute_loss_from_embeddings([h, hp], None).item() for _ in range(steps)]

    first = run(3)
    assert run(3) == first
    assert first[0] != first[1]  # the generator is kept and advances between batches
    assert run(4) != first
    loss = HNCSELoss(None, mode="hnm", seed=3, k=5)
    loss.compute_loss_from_embeddings([h, hp], None)
    assert loss._generator is not None and loss._generator.device == h.device

    def global_rng_run():
        torch.manual_seed(11)
        return HNCSELoss(None, mode="hnm", k=5, num_mixed=6).compute_loss_from_embeddings([h, hp], None).item()

    assert global_rng_run() == global_rng_run()


# ---------------------------------------------------------------------------------------------- bad input, bf16
@pytest.mark.parametrize(("kwargs", "name"), [
    ({"mode": "mix"}, "mode"),
    ({"temperature": 0}, "temperature"),
    ({"temperature": -1.0}, "temperature"),
    ({"pm_threshold": -0.1}, "pm_threshold"),
    ({"pm_threshold": float("nan")}, "pm_threshold"),
    ({"w1": -0.5}, "w1"),
    ({"w2": float("inf")}, "w2"),
    ({"w1": 0.0, "w2": 0.0}, "w1 \\+ w2"),
    ({"k": 0}, "k"),
    ({"k": 1}, "k"),  # mixing needs two distinct hard negatives
    ({"k": 2.5}, "k"),
    ({"k": 0, "hnm_single": True}, "k"),
    ({"num_mixed": 0}, "num_mixed"),
    ({"alpha": 1.5}, "alpha"),
    ({"alpha": -0.1}, "alpha"),
    ({"alpha": "cosine"}, "alpha"),
    ({"alpha": None}, "alpha"),
    ({"focal_m": -0.3}, "focal_m"),
])
def test_bad_arguments(kwargs, name):
    with pytest.raises(ValueError, match=name):
        HNCSELoss(None, **kwargs)


def test_k1_is_fine_for_the_single_ablation():
    assert HNCSELoss(None, mode="hnm", k=1, hnm_single=True).k == 1


@pytest.mark.parametrize("mode", ["pm", "hnm", "both"])
def test_bf16_autocast_is_finite(mode):
    h, hp, neg = (c.float().bfloat16().requires_grad_() for c in random_columns(n=16, d=32, columns=3))
    loss = HNCSELoss(None, mode=mode, k=4, num_mixed=8, pm_threshold=10.0, alpha="adaptive", focal_m=0.3, seed=0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        value = loss.compute_loss_from_embeddings([h, hp, neg], None)
    value.backward()
    assert torch.isfinite(value)
    assert all(torch.isfinite(t.grad).all() for t in (h, hp, neg))


def test_bf16_autocast_with_model(tiny_model, tiny_sentences):
    features = tiny_model.tokenize(tiny_sentences[:8])
    loss = HNCSELoss(tiny_model, mode="both", k=4, num_mixed=8, seed=0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        value = loss([features, features], None)
    value.backward()
    assert torch.isfinite(value)


def test_config_and_citation():
    loss = HNCSELoss(None, mode="both", alpha=ref_adaptive, seed=1)
    config = loss.get_config_dict()
    assert config["alpha"] == "ref_adaptive" and config["mode"] == "both" and config["w1"] == W1
    assert config["w2"] == W2 and config["k"] == 10 and config["num_mixed"] == 40 and config["seed"] == 1
    assert HNCSELoss(None, alpha="adaptive").get_config_dict()["alpha"] == "adaptive"
    assert "2411.12156" in loss.citation


# ---------------------------------------------------------------------------------------------- training
def test_hncse_trains_with_fit(tiny_model, tiny_sentences, tmp_path, monkeypatch):
    from sentence_transformers import InputExample

    monkeypatch.chdir(tmp_path)  # fit() writes its default checkpoint directory relative to the cwd
    examples = [InputExample(texts=[s, s]) for s in tiny_sentences]
    loader = DataLoader(examples, batch_size=8, shuffle=True)
    loss = HNCSELoss(tiny_model, mode="both", pm_threshold=1.0, k=4, num_mixed=8, seed=0)
    values = record_loss_values(loss)
    before = parameter_snapshot(tiny_model)
    tiny_model.fit(train_objectives=[(loader, loss)], epochs=1, warmup_steps=0, show_progress_bar=False)
    assert values and all(math.isfinite(v) for v in values)
    assert parameters_changed(tiny_model, before)


@pytest.mark.parametrize("mode", ["pm", "hnm"])
def test_hncse_trains_with_trainer(tiny_model, tiny_sentences, tmp_path, mode):
    from datasets import Dataset
    from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments

    dataset = Dataset.from_dict({"anchor": tiny_sentences, "positive": tiny_sentences})
    args = SentenceTransformerTrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=8, num_train_epochs=1, learning_rate=1e-3,
        report_to=[], save_strategy="no", seed=0,
    )
    loss = HNCSELoss(tiny_model, mode=mode, k=4, num_mixed=8, seed=0)
    values = record_loss_values(loss)
    before = parameter_snapshot(tiny_model)
    trainer = SentenceTransformerTrainer(model=tiny_model, args=args, train_dataset=dataset, loss=loss)
    trainer.train()
    assert len(values) == 2 and all(math.isfinite(v) for v in values)
    assert math.isfinite(trainer.state.log_history[-1]["train_loss"])
    assert parameters_changed(tiny_model, before)
