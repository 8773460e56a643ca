"""False-negative control (mask_duplicates, margin, guide) in every loss, against losses written out
here with plain loops: a masked candidate is simply deleted from its anchor's row."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch

from st_hardneg import AdversarialNegativesLoss, FocalInfoNCELoss, HNCSELoss, MixCSELoss
from st_hardneg.losses.keys import text_keys
from st_hardneg.testing import ce, cosf, two_way, unit

TAU = 0.05


# ---------------------------------------------------------------------------------------------- reference math
def logit(c: float, positive: bool, focal_m: float | None, tau: float = TAU) -> float:
    if focal_m is None:
        return c / tau
    return (c * c if positive else c * (c + focal_m)) / tau


def direction(anchors, candidates, removed: set, extras=None, focal_m=None, tau=TAU) -> list[float]:
    """Per-row InfoNCE of anchor i over candidates (positive = candidates[i]), without the (i, c) in ``removed``,
    plus the per-row extra negative cosines ``extras[i]``."""
    rows = []
    for i in range(anchors.shape[0]):
        logits, target = [], None
        for c in range(candidates.shape[0]):
            if (i, c) in removed:
                continue
            if c == i:
                target = len(logits)
            logits.append(logit(cosf(anchors[i], candidates[c]), c == i, focal_m, tau))
        for e in (extras[i] if extras is not None else []):
            logits.append(logit(e, False, focal_m, tau))
        rows.append(ce(logits, target))
    return rows


def mean(values) -> float:
    return sum(values) / len(values)


def columns(n=6, d=8, num=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    cols = [torch.randn(n, d, generator=g, dtype=torch.float64) for _ in range(num)]
    cols[1] = cols[0] + 0.6 * cols[1]
    return cols


def planted(n=6, d=8, num=2, seed=0):
    """Columns where positive 3 is an exact copy of positive 1 (a duplicate sentence) and, with a negative column,
    the explicit negative of pair 4 is an exact copy of positive 0 (a mined negative that is a true positive)."""
    cols = columns(n, d, num, seed)
    cols[1][3] = cols[1][1]
    if num > 2:
        cols[2][4] = cols[1][0]
    return cols


def duplicate_pairs(n, num):
    """The (anchor, candidate column) pairs the planted duplicates must remove."""
    removed = {(1, 3), (3, 1)}
    if num > 2:
        removed.add((0, n + 4))
    return removed


def stack(cols):
    return torch.cat([cols[1], *cols[2:]]) if len(cols) > 2 else cols[1]


# ---------------------------------------------------------------------------------------------- Focal
@pytest.mark.parametrize("num", [2, 3])
@pytest.mark.parametrize("symmetric", [False, True])
def test_focal_planted_duplicate_is_a_negative_only_without_masking(num, symmetric):
    cols = planted(num=num)
    n, m = cols[0].shape[0], 0.3
    h, cands = cols[0], stack(cols)
    removed = duplicate_pairs(n, num)

    def expected(rem):
        rows = direction(h, cands, rem, focal_m=m)
        if symmetric:  # h'_j as the anchor over h; the transposed in-batch mask
            reverse = direction(cols[1], h, {(c, i) for i, c in rem if c < n}, focal_m=m)
            rows = [(a + b) / 2 for a, b in zip(rows, reverse, strict=True)]
        return mean(rows)

    plain = FocalInfoNCELoss(None, m=m, **two_way(symmetric), mask_duplicates=False)
    masked = FocalInfoNCELoss(None, m=m, **two_way(symmetric))
    without = plain.compute_loss_from_embeddings(cols, None).item()
    with_mask = masked.compute_loss_from_embeddings(cols, None).item()
    assert without == pytest.approx(expected(set()), rel=1e-5)
    assert with_mask == pytest.approx(expected(removed), rel=1e-5)
    assert abs(without - with_mask) > 1e-3  # the duplicate really was a (hard) negative without masking
    assert masked.diagnostics["masked_false_negatives_total"] == len(removed)
    assert masked.diagnostics["masked_false_negatives"] == pytest.approx(len(removed) / n)
    assert "masked_false_negatives" not in plain.diagnostics


def test_unsupervised_pairs_never_mask_the_positive():
    h = columns()[0]
    loss = FocalInfoNCELoss(None, m=0.3)
    value = loss.compute_loss_from_embeddings([h, h.clone()], None).item()
    assert value == pytest.approx(mean(direction(h, h, set(), focal_m=0.3)), rel=1e-4, abs=1e-7)
    assert loss.diagnostics.get("masked_false_negatives_total", 0.0) == 0.0


def hand_threshold_mask(sim, margin, strategy):
    removed = set()
    for i in range(len(sim)):
        pos = sim[i][i]
        threshold = pos - margin if strategy == "absolute" else pos - abs(pos) * margin
        removed |= {(i, c) for c in range(len(sim[i])) if c != i and sim[i][c] > threshold}
    return removed


@pytest.mark.parametrize("strategy,margin", [("absolute", 0.1), ("absolute", 0.0), ("relative", 0.2)])
def test_focal_margin_threshold_matches_hand_mask(strategy, margin):
    cols = columns(n=7, num=3, seed=3)
    cols[1] = cols[0] + 1.5 * torch.randn(cols[0].shape, generator=torch.Generator().manual_seed(9),
                                          dtype=torch.float64)  # loose positives: some candidates are closer
    h, cands = cols[0], stack(cols)
    sim = [[cosf(h[i], cands[c]) for c in range(cands.shape[0])] for i in range(h.shape[0])]
    removed = hand_threshold_mask(sim, margin, strategy)
    assert removed  # the scenario must mask something
    loss = FocalInfoNCELoss(None, m=0.3, margin=margin, margin_strategy=strategy)
    value = loss.compute_loss_from_embeddings(cols, None).item()
    assert value == pytest.approx(mean(direction(h, cands, removed, focal_m=0.3)), rel=1e-5)
    assert loss.diagnostics["masked_false_negatives_total"] == len(removed)
    assert loss.get_config_dict()["margin"] == margin
    assert loss.get_config_dict()["margin_strategy"] == strategy


def test_guide_embeddings_decide_the_threshold():
    cols = columns(n=5, seed=4)
    g = torch.Generator().manual_seed(5)
    guide = [torch.randn(5, 3, generator=g, dtype=torch.float64) for _ in range(2)]
    guide[1] = guide[0] + 0.1 * guide[1]
    guide[1][2] = guide[0][0] * 1.01  # the guide sees positive 2 as a copy of anchor 0's meaning
    sim = [[cosf(guide[0][i], guide[1][c]) for c in range(5)] for i in range(5)]
    removed = hand_threshold_mask(sim, 0.05, "absolute")
    assert (0, 2) in removed
    loss = FocalInfoNCELoss(None, m=0.3, margin=0.05)
    loss.set_false_negative_inputs(guide_embeddings=guide)
    value = loss.compute_loss_from_embeddings(cols, None).item()
    assert value == pytest.approx(mean(direction(cols[0], cols[1], removed, focal_m=0.3)), rel=1e-5)


def test_text_keys_mask_identical_texts_even_with_different_embeddings():
    cols = columns(n=5, num=3, seed=6)  # all embeddings distinct
    keys = torch.tensor([[0, 1, 2, 3, 4], [5, 6, 5, 7, 8], [9, 10, 11, 6, 12]])  # positive 2 = positive 0 (text);
    removed = {(0, 2), (2, 0), (1, 5 + 3)}  # negative of pair 3 has the text of positive 1
    loss = FocalInfoNCELoss(None, m=0.3)
    loss.set_false_negative_inputs(text_keys=keys)
    value = loss.compute_loss_from_embeddings(cols, None).item()
    assert value == pytest.approx(mean(direction(cols[0], stack(cols), removed, focal_m=0.3)), rel=1e-5)
    # the keys are used once: the next call without them masks nothing
    again = loss.compute_loss_from_embeddings(cols, None).item()
    assert again == pytest.approx(mean(direction(cols[0], stack(cols), set(), focal_m=0.3)), rel=1e-5)


def test_text_keys_from_token_ids_ignore_padding():
    ids = torch.tensor([[101, 7, 8, 102, 0], [101, 7, 8, 102, 5], [101, 9, 102, 0, 0]])
    attention = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 0], [1, 1, 1, 0, 0]])
    other = torch.tensor([[101, 9, 102], [101, 4, 102], [101, 7, 102]])
    keys = text_keys([{"input_ids": ids, "attention_mask": attention},
                      {"input_ids": other, "attention_mask": torch.ones_like(other)}])
    assert keys.shape == (2, 3)
    assert keys[0, 0] == keys[0, 1]  # same tokens under the mask
    assert keys[0, 2] == keys[1, 0]  # same text in two columns
    assert len({int(keys[0, 0]), int(keys[0, 2]), int(keys[1, 1]), int(keys[1, 2])}) == 4
    assert text_keys([{"pixel_values": torch.zeros(2, 3)}]) is None


def test_forward_masks_duplicate_texts_of_the_positive_column(tiny_model):
    texts = ["a man plays the guitar.", "the sky is blue.", "a man plays the guitar.", "snow is cold."]
    tiny_model.train()  # dropout: the two copies get different embeddings, only their text is identical
    features = [tiny_model.tokenize(texts), tiny_model.tokenize(texts)]
    keys = text_keys(features)  # the tokenizer's own output type (a BatchEncoding, not a dict)
    assert keys is not None and keys[1, 0] == keys[1, 2] and keys[1, 0] != keys[1, 1]
    loss = FocalInfoNCELoss(tiny_model, m=0.3)
    loss(features, None).backward()
    # rows 0 and 2 hold the same sentence: each is a false negative of the other, the own positive never
    assert loss.diagnostics["masked_false_negatives_total"] == 2
    clean = FocalInfoNCELoss(tiny_model, m=0.3)
    clean([tiny_model.tokenize(texts[:2] + texts[3:])] * 2, None)
    assert clean.diagnostics.get("masked_false_negatives_total", 0.0) == 0.0


@pytest.mark.parametrize("factory", [
    lambda m: MixCSELoss(m, partner="hardest"),
    lambda m: HNCSELoss(m, mode="both", k=2, num_mixed=3, seed=0),
    lambda m: AdversarialNegativesLoss(m, num_adversaries=2, seed=0),
], ids=["mixcse", "hncse", "adcse"])
def test_every_loss_forward_masks_duplicate_texts(tiny_model, factory):
    texts = ["the sky is blue.", "snow is cold.", "the cat eats food.", "snow is cold.", "the sun is hot."]
    tiny_model.train()  # dropout: duplicates differ in embedding, only the text check can find them
    loss = factory(tiny_model)
    loss([tiny_model.tokenize(texts), tiny_model.tokenize(texts)], None).backward()
    assert loss.diagnostics["masked_false_negatives_total"] == 2  # rows 1 and 3 mask each other, never themselves


def test_forward_with_a_guide_that_must_retokenize(tiny_model, tiny_model_dir):
    from st_hardneg.models import load_model

    guide = load_model(tiny_model_dir, pooling="mean", max_seq_length=16, device="cpu")  # shorter: re-tokenise
    loss = FocalInfoNCELoss(tiny_model, m=0.3, margin=0.0, guide=guide)
    assert loss._must_retokenize
    texts = ["a man plays the guitar.", "the sky is blue.", "the cat eats food.", "snow is cold."]
    tiny_model.eval()
    loss([tiny_model.tokenize(texts), tiny_model.tokenize(texts)], None)
    g = torch.nn.functional.normalize(guide.encode(texts, convert_to_tensor=True).double(), dim=1)
    sim = (g @ g.T).tolist()
    assert loss.diagnostics["masked_false_negatives_total"] == len(hand_threshold_mask(sim, 0.0, "absolute"))
    assert loss.get_config_dict()["guide"]


# ---------------------------------------------------------------------------------------------- MixCSE
def mixcse_rows(h, hp, negs, lam, removed, partner_of, reverse_partner_of, symmetric, reverse_mix=True):
    """MixCSE paper layout with masked candidates deleted; partner_of(i) -> source row index or None (no mix)."""
    n = h.shape[0]
    cands = torch.cat([hp, *negs]) if negs else hp

    def mixes(source, partner):
        out = []
        for i in range(n):
            j = partner(i)
            out.append([] if j is None else [cosf(anchor_rows[i], unit(lam * unit(source[i]) + (1 - lam) * unit(
                source_rows[j])))])
        return out

    anchor_rows, source_rows = h, hp
    forward = direction(h, cands, removed, extras=mixes(hp, partner_of))
    if not symmetric:
        return mean(forward)
    anchor_rows, source_rows = hp, h
    reverse_extras = mixes(h, reverse_partner_of) if reverse_mix else None
    reverse = direction(hp, h, {(c, i) for i, c in removed if c < n}, extras=reverse_extras)
    return mean([(a + b) / 2 for a, b in zip(forward, reverse, strict=True)])


def hardest_allowed(anchors, cands, removed, i):
    n = anchors.shape[0]
    options = [j for j in range(n) if j != i and (i, j) not in removed]
    return max(options, key=lambda j: cosf(anchors[i], cands[j])) if options else None


@pytest.mark.parametrize("symmetric", [False, True])
def test_mixcse_hardest_partner_skips_the_planted_duplicate(symmetric):
    cols = planted(num=3)
    h, hp, negs = cols[0], cols[1], [cols[2]]
    n = h.shape[0]
    removed = duplicate_pairs(n, 3)
    kw = dict(lam=0.2, partner="hardest", **two_way(symmetric), seed=0)
    masked = MixCSELoss(None, **kw).compute_loss_from_embeddings(cols, None).item()
    plain = MixCSELoss(None, mask_duplicates=False, **kw).compute_loss_from_embeddings(cols, None).item()
    exp_masked = mixcse_rows(h, hp, negs, 0.2, removed, lambda i: hardest_allowed(h, hp, removed, i),
                             lambda j: hardest_allowed(hp, h, {(c, i) for i, c in removed if c < n}, j), symmetric)
    exp_plain = mixcse_rows(h, hp, negs, 0.2, set(), lambda i: hardest_allowed(h, hp, set(), i),
                            lambda j: hardest_allowed(hp, h, set(), j), symmetric)
    assert masked == pytest.approx(exp_masked, rel=1e-5)
    assert plain == pytest.approx(exp_plain, rel=1e-5)
    # without masking, anchor 1's hardest partner is the copy of its own positive: the "negative" is the positive
    assert hardest_allowed(h, hp, set(), 1) == 3 and hardest_allowed(h, hp, removed, 1) != 3


def test_mixcse_shift_partner_moves_past_a_masked_one():
    cols = planted()
    h, hp = cols[0], cols[1]
    n = h.shape[0]
    removed = duplicate_pairs(n, 2) | {(2, 3), (2, 4)}  # plus: row 2's next two candidates masked by a threshold

    def next_allowed(rem):
        def partner(i):
            for t in range(1, n):
                j = (i + t) % n
                if (i, j) not in rem:
                    return j
            return None
        return partner

    loss = MixCSELoss(None, lam=0.2, partner="shift", **two_way(True))
    batch = loss.preparer.window(loss.preparer.prepare(cols), None)
    for i, c in removed:  # a masked false negative leaves both directions, as the loss's own masks do
        batch.false_negatives[i, c] = True
        batch.block_masks["doc_to_query"][c, i] = True
    value = loss.window_rows(loss.begin_batch(batch)).mean().item()
    reverse_removed = {(c, i) for i, c in removed}
    expected = mixcse_rows(h, hp, [], 0.2, removed, next_allowed(removed), next_allowed(reverse_removed), True)
    assert value == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("loss_factory", [
    lambda: MixCSELoss(None, partner="hardest", margin=3.0),
    lambda: MixCSELoss(None, partner="shift", margin=3.0),
    lambda: MixCSELoss(None, partner="explicit", margin=3.0),
    lambda: MixCSELoss(None, layout="official", reverse_mix=False, margin=3.0),
    lambda: FocalInfoNCELoss(None, **two_way(True), margin=3.0),
    lambda: HNCSELoss(None, mode="both", k=3, num_mixed=4, seed=0, margin=3.0),
    lambda: HNCSELoss(None, mode="hnm", hnm_single=True, k=2, hnm_pool="all_negatives", margin=3.0),
], ids=["mix-hardest", "mix-shift", "mix-explicit", "mix-official", "focal", "hncse-both", "hncse-single-all"])
def test_every_negative_masked_is_an_error(loss_factory):
    """A margin of 3 masks every candidate (cosines are >= -1): each row keeps only its positive and rows without an
    allowed partner get no mix, so no row has a negative: the batch is refused (the rule for a batch with no
    usable row), after the masked counts were recorded."""
    cols = [c.float().requires_grad_(True) for c in columns(n=5, num=3, seed=8)]
    loss = loss_factory()
    with pytest.raises(ValueError, match=r"no usable row in this batch: 5 of 5 rows of a batch have no negative left"):
        loss.compute_loss_from_embeddings(cols, None)
    assert loss.diagnostics["masked_false_negatives"] == pytest.approx(5 + 5 - 1)


def test_mixcse_official_layout_masks_block_one_columns():
    """In the official layout a masked candidate leaves block 1, and every mix containing it leaves block 2."""
    cols = planted()
    h, hp = cols[0], cols[1]
    n, lam = h.shape[0], 0.2
    removed = duplicate_pairs(n, 2)
    value = MixCSELoss(None, lam=lam, layout="official", reverse_mix=False).compute_loss_from_embeddings(
        cols, None).item()
    total = 0.0
    for a in range(n):
        row, target = [], None
        for b in range(n):
            if (a, b) in removed:
                continue
            if b == a:
                target = len(row)
            row.append(cosf(h[a], hp[b]) / TAU)
        for b in range(n):
            partner = (b + 1) % n
            if (a, b) in removed or (a, partner) in removed:
                continue
            row.append(0.0 if partner == a else cosf(h[a], lam * hp[b] + (1 - lam) * hp[partner]) / TAU)
        total += ce(row, target)
    assert value == pytest.approx(total / n, rel=1e-5)


# ---------------------------------------------------------------------------------------------- HNCSE
def test_hncse_pm_never_mixes_a_masked_duplicate_into_the_positive():
    cols = planted()
    h, hp = cols[0], cols[1]
    n = h.shape[0]
    removed = duplicate_pairs(n, 2)
    loss = HNCSELoss(None, mode="pm", pm_threshold=10.0, w1=0.8, w2=0.2)  # every row with d1 > d2 is "near"
    value = loss.compute_loss_from_embeddings(cols, None).item()
    positives = []
    for i in range(n):
        j = hardest_allowed(h, hp, removed, i)
        d1, d2 = cosf(h[i], hp[i]), cosf(h[i], hp[j])
        if d1 <= 0 or d1 + d2 <= 0:
            positives.append(unit(hp[i]))
        elif d1 > d2:
            positives.append(unit(0.8 * unit(hp[i]) + 0.2 * unit(hp[j])))
        else:
            positives.append(unit(d1 / (d1 + d2) * unit(hp[i]) + d2 / (d1 + d2) * unit(hp[j])))
    p = torch.stack(positives)
    assert value == pytest.approx(mean(direction(h, p, removed)), rel=1e-5)
    plain = HNCSELoss(None, mode="pm", pm_threshold=10.0, mask_duplicates=False).compute_loss_from_embeddings(
        cols, None).item()
    assert abs(plain - value) > 1e-3


@pytest.mark.parametrize("pool", ["in_batch_negatives", "hard_negatives", "all_negatives"])
def test_hncse_hnm_single_pool_and_mask(pool):
    cols = planted(n=6, num=3)
    h, cands = cols[0], stack(cols)
    n, k = h.shape[0], 2
    removed = duplicate_pairs(n, 3)
    span = {"in_batch_negatives": range(n), "hard_negatives": range(n, 2 * n), "all_negatives": range(2 * n)}[pool]
    extras = []
    for i in range(n):
        allowed = [c for c in span if c != i and (i, c) not in removed]
        top = sorted(allowed, key=lambda c: -cosf(h[i], cands[c]))[:k]
        extras.append([cosf(h[i], cands[c]) for c in top])
    loss = HNCSELoss(None, mode="hnm", hnm_single=True, k=k, hnm_pool=pool)
    value = loss.compute_loss_from_embeddings(cols, None).item()
    assert value == pytest.approx(mean(direction(h, cands, removed, extras=extras)), rel=1e-5)
    assert loss.get_config_dict()["hnm_pool"] == pool


def test_hncse_hnm_mixtures_from_unmasked_pool_with_redrawn_pairs():
    cols = planted(n=6, num=3)
    h, cands = cols[0], stack(cols)
    n, k, m, seed = h.shape[0], 3, 5, 11
    removed = duplicate_pairs(n, 3)
    loss = HNCSELoss(None, mode="hnm", k=k, num_mixed=m, hnm_pool="all_negatives", seed=seed)
    value = loss.compute_loss_from_embeddings(cols, None).item()
    g = torch.Generator().manual_seed(seed)  # the loss's documented draw: a uniform, b = a + uniform[1, k) mod k
    first = torch.randint(k, (n, m), generator=g)
    second = (first + torch.randint(1, k, (n, m), generator=g)) % k
    extras = []
    for i in range(n):
        allowed = [c for c in range(2 * n) if c != i and (i, c) not in removed]
        top = sorted(allowed, key=lambda c: -cosf(h[i], cands[c]))[:k]
        extras.append([cosf(h[i], unit(0.5 * unit(cands[top[a]]) + 0.5 * unit(cands[top[b]])))
                       for a, b in zip(first[i].tolist(), second[i].tolist(), strict=True)])
    assert value == pytest.approx(mean(direction(h, cands, removed, extras=extras)), rel=1e-5)


# ---------------------------------------------------------------------------------------------- AdCSE
@pytest.mark.parametrize("num_adversaries", [0, 3])
def test_adcse_masks_keys_but_never_adversaries(tiny_model, num_adversaries):
    g = torch.Generator().manual_seed(2)
    d = tiny_model.get_embedding_dimension()
    cols = [torch.randn(5, d, generator=g, dtype=torch.float64) for _ in range(3)]
    cols[1] = cols[0] + 0.5 * cols[1]
    cols[1][3] = cols[1][1]
    cols[2][4] = cols[1][0]
    removed = duplicate_pairs(5, 3)
    kw = dict(num_adversaries=num_adversaries, untied=False, seed=1, adversary_lr=0.0)
    loss = AdversarialNegativesLoss(tiny_model, **kw)
    plain = AdversarialNegativesLoss(tiny_model, mask_duplicates=False, **kw)
    adversaries = [[cosf(cols[0][i], a) for a in loss.adversaries.detach()] for i in range(5)]
    with torch.no_grad():
        value = loss.compute_loss_from_embeddings(cols, None).item()
        without = plain.compute_loss_from_embeddings(cols, None).item()
    assert value == pytest.approx(mean(direction(cols[0], stack(cols), removed, extras=adversaries)), rel=1e-5)
    assert without == pytest.approx(mean(direction(cols[0], stack(cols), set(), extras=adversaries)), rel=1e-5)
    assert abs(value - without) > 1e-3


# ---------------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("kwargs,match", [
    (dict(margin=-0.1), "margin"),
    (dict(margin=float("nan")), "margin"),
    (dict(margin_strategy="percent"), "margin_strategy"),
    (dict(mask_duplicates="yes"), "mask_duplicates"),
    (dict(guide=object()), "guide"),
])
@pytest.mark.parametrize("cls", [FocalInfoNCELoss, MixCSELoss, HNCSELoss])
def test_bad_false_negative_arguments(cls, kwargs, match):
    with pytest.raises(ValueError, match=match):
        cls(None, **kwargs)


def test_guide_needs_embeddings_when_called_directly(tiny_model):
    loss = FocalInfoNCELoss(tiny_model, margin=0.1, guide=tiny_model)
    d = tiny_model.get_embedding_dimension()
    with pytest.raises(ValueError, match="guide embeddings"):
        loss.compute_loss_from_embeddings([torch.randn(3, d), torch.randn(3, d)], None)


def test_text_keys_of_the_wrong_shape_are_rejected():
    loss = FocalInfoNCELoss(None)
    loss.set_false_negative_inputs(text_keys=torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="text keys"):
        loss.compute_loss_from_embeddings(columns(n=5), None)


def test_false_negative_log_counts_what_the_loss_masked_per_step():
    from st_hardneg.training.callbacks import FalseNegativeLog

    class Stub(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.diagnostics = {}

    loss = Stub()
    log = FalseNegativeLog(loss)
    for diagnostics in ({}, {"masked_false_negatives_total": 3.0}, {"masked_false_negatives_total": 0.0},
                        {"masked_false_negatives_total": 5.0, "masked_false_negatives": 0.625}):
        loss.diagnostics = diagnostics
        log.on_step_end(None, None, None)
    assert log.per_step == [0.0, 3.0, 0.0, 5.0]
    assert log.summary() == {"steps": 4, "masked_total": 8.0, "masked_per_batch": 2.0, "batches_with_any": 2}
    assert FalseNegativeLog(Stub()).summary()["masked_per_batch"] == 0.0
    with pytest.raises(TypeError, match="diagnostics"):
        FalseNegativeLog(torch.nn.Linear(2, 2))


def test_false_negative_log_in_a_real_training_step_matches_the_diagnostics(tiny_model):
    from datasets import Dataset

    from st_hardneg import AdversarialNegativesLoss
    from st_hardneg.training import TrainConfig, train
    from st_hardneg.training.callbacks import FalseNegativeLog

    # an absolute margin of 2 masks every non-positive candidate: 3 other positives + 4 negatives per anchor (in the
    # paper's Eq. 5, in_batch_keys=False, the adversaries, never masked, are a row's negatives, so the rows stay
    # usable; with the in-batch keys, adversaries alone do not make a row usable and the batch would be refused)
    loss = AdversarialNegativesLoss(tiny_model, num_adversaries=4, untied=False, margin=2.0, seed=0,
                                    in_batch_keys=False)
    log = FalseNegativeLog(loss)
    texts = [f"sentence number {i}" for i in range(8)]
    data = Dataset.from_dict({"anchor": texts, "positive": [t + " again" for t in texts],
                              "negative": [t + " not" for t in texts]})
    config = TrainConfig(output_dir=str(Path(tempfile.mkdtemp())), batch_size=4, max_steps=2, eval_steps=0,
                         save_checkpoints=False, show_progress_bar=False)
    train(tiny_model, data, loss, config, callbacks=[log])
    assert log.per_step == [4 * (3 + 4)] * 2 == [loss.diagnostics["masked_false_negatives_total"]] * 2


# --------------------------------------------------------------------------- a batch with nothing to mask
@pytest.mark.parametrize("make", [
    lambda: FocalInfoNCELoss(None),
    lambda: MixCSELoss(None, seed=3),
    lambda: MixCSELoss(None, partner="hardest"),
    lambda: MixCSELoss(None, seed=3, directions=("query_to_doc", "doc_to_query"), partition_mode="per_direction"),
    lambda: HNCSELoss(None, mode="both", pm_threshold=0.2, k=2, num_mixed=3, seed=1),
    lambda: AdversarialNegativesLoss(torch.nn.Linear(8, 8), untied=False, num_adversaries=0),
], ids=["focal", "mixcse", "mixcse-hardest", "mixcse-two-way", "hncse", "adcse"])
@pytest.mark.parametrize("chunk", [None, 3])
def test_a_batch_without_duplicates_carries_no_mask_and_the_same_loss(make, chunk):
    """No two candidates share an embedding or a text: the windows carry no mask (no rows x candidates tensor) and
    the loss and its gradients are those computed with the (all-False) mask."""
    torch.manual_seed(0)
    columns = [torch.randn(7, 8, dtype=torch.float64) for _ in range(3)]
    keys = torch.arange(21).reshape(3, 7)
    results = []
    for skip in (True, False):
        loss = make()
        if chunk is not None:
            loss.mini_batch_size = chunk  # the loss side in chunks of rows, as under GradCache
        if not skip:
            loss.preparer._nothing_to_mask = lambda batch: False
        leaves = [c.clone().requires_grad_() for c in columns]
        loss.set_false_negative_inputs(text_keys=keys)
        batch = loss.preparer.prepare(leaves, None)
        window = loss.preparer.window(batch, 0, 4)
        assert (window.false_negatives is None) is skip
        loss.set_false_negative_inputs(text_keys=keys)
        if chunk is not None:
            assert loss.supports_row_chunks
            value = loss.compute(leaves, None, chunk_size=chunk, with_backward=True)  # back-propagated chunk by chunk
        else:
            value = loss.compute_loss_from_embeddings(leaves, None)
            value.backward()
        results.append((value.detach(), [leaf.grad for leaf in leaves]))
    (a, grads_a), (b, grads_b) = results
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    for x, y in zip(grads_a, grads_b, strict=True):
        torch.testing.assert_close(x, y, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("directions", [("query_to_doc",), ("query_to_doc", "doc_to_query")])
def test_a_repeated_text_still_masks(directions):
    loss = FocalInfoNCELoss(None, directions=directions)
    columns = [torch.randn(5, 8) for _ in range(2)]
    from st_hardneg.losses.batch import CallContext, SideInputs

    keys = torch.tensor([[1, 2, 3, 4, 5], [6, 7, 8, 7, 9]])  # positive 3 = 1
    context = CallContext(side_inputs=SideInputs(text_keys=keys))
    window = loss.preparer.window(loss.preparer.prepare(columns, None, context=context), None)
    assert window.false_negatives is not None and bool(window.false_negatives[1, 3]) and bool(
        window.false_negatives[3, 1])


def _key_by_hand(tokens: list[int]) -> int:
    """The documented id: two polynomial hashes sum_j (t_j + 1) * B**j mod P, packed as (h1 << 31) | h2."""
    from st_hardneg.losses.keys import KEY_BASES, KEY_PRIMES

    h = [sum((t + 1) * pow(b, j, p) for j, t in enumerate(tokens)) % p for b, p in zip(KEY_BASES, KEY_PRIMES,
                                                                                         strict=True)]
    return (h[0] << 31) | h[1]


def test_text_keys_are_the_documented_hash_whatever_the_padding_side_width_and_dtype():
    wide_rows = [[101, 7, 8, 102], [101, 9, 102], [101, 30521, 0, 2**31 + 5, 102]]  # a token id above 31 bits
    narrow_rows = wide_rows[:2]  # int32 ids
    width = 7

    def padded(rows, left: bool, dtype: torch.dtype):
        ids = torch.zeros(len(rows), width, dtype=dtype)
        mask = torch.zeros(len(rows), width, dtype=torch.long)
        for i, row in enumerate(rows):
            cols = slice(width - len(row), width) if left else slice(0, len(row))
            ids[i, cols], mask[i, cols] = torch.tensor(row, dtype=dtype), 1
        return {"input_ids": ids, "attention_mask": mask}

    for rows, dtype in ((wide_rows, torch.long), (narrow_rows, torch.int32)):
        expected = torch.tensor([[_key_by_hand(r) for r in rows]])
        for left in (False, True):
            assert torch.equal(text_keys([padded(rows, left, dtype)]), expected), (dtype, left)
    # no mask: every position is a token (the padding ids too)
    unmasked = torch.tensor([[101, 7, 102, 0]])
    assert int(text_keys([{"input_ids": unmasked}])[0, 0]) == _key_by_hand([101, 7, 102, 0]) != \
        _key_by_hand([101, 7, 102])


def test_text_keys_in_blocks_equal_one_block_and_hold_no_python_integers(monkeypatch):
    import tracemalloc

    from st_hardneg.losses import keys as keys_module

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, 30000, (4096, 32), generator=g)
    mask = (torch.arange(32) < torch.randint(3, 33, (4096, 1), generator=g)).long()
    whole = text_keys([{"input_ids": ids, "attention_mask": mask}])
    monkeypatch.setattr(keys_module, "KEY_BLOCK_ROWS", 1000)  # 5 blocks, the last one short
    tracemalloc.start()
    blocked = text_keys([{"input_ids": ids, "attention_mask": mask}])
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert torch.equal(whole, blocked)
    # hashing tuples of Python ints held ~36 bytes per token here (4.7 MB); the tensor hash holds none
    assert peak < 200_000, peak
    rows = [ids[i][mask[i].bool()].tolist() for i in (0, 17, 4095)]
    assert [int(whole[0, i]) for i in (0, 17, 4095)] == [_key_by_hand(r) for r in rows]


def test_packed_text_keys_ignore_tokens_outside_the_rows():
    ids = torch.tensor([[101, 7, 102, 101, 9, 9, 102, 55, 56]])
    keys = text_keys([{"input_ids": ids, "cu_seq_lens_q": torch.tensor([0, 3, 7])}])
    assert keys.tolist() == [[_key_by_hand([101, 7, 102]), _key_by_hand([101, 9, 9, 102])]]
