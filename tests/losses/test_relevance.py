"""Known-relevance masking (``known_positives``): a candidate the mapping marks relevant to an anchor leaves that
anchor's denominator, its mixing partners and its hard-negative pools, in every loss and in the queue; the index is
keyed like ``forward``'s text keys; cached = uncached = gathered."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from st_hardneg import AdversarialNegativesLoss, FocalInfoNCELoss, HNCSELoss, MixCSELoss
from st_hardneg.losses.keys import text_keys
from st_hardneg.losses.relevance import KnownPositives
from st_hardneg.testing import ce, cosf, unit

TAU = 0.05

#: keys of a 6-row, 3-column batch whose texts are all distinct
DISTINCT = torch.tensor([[0, 1, 2, 3, 4, 5], [10, 11, 12, 13, 14, 15], [20, 21, 22, 23, 24, 25]])
#: the same batch where positive 3 repeats positive 1's text and the negative of pair 4 repeats positive 0's
DUPLICATED = torch.tensor([[0, 1, 2, 3, 4, 5], [10, 11, 12, 11, 14, 15], [20, 21, 22, 23, 10, 25]])
#: the (anchor, candidate) pairs the duplicates mask: (1, 3), (3, 1), (0, negative of pair 4 = column 6 + 4)
DUPLICATE_PAIRS = {(1, 3), (3, 1), (0, 10)}


def known_like_the_duplicates() -> KnownPositives:
    """The mapping that marks exactly the duplicates of :data:`DUPLICATED`, on the keys of :data:`DISTINCT`."""
    return KnownPositives(torch.tensor([1, 3, 0]), torch.tensor([13, 11, 24]))


def columns(n=6, d=8, num=3, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    cols = [torch.randn(n, d, generator=g, dtype=dtype) for _ in range(num)]
    cols[1] = cols[0] + 0.6 * cols[1]
    return cols


def infonce_rows(anchors, candidates, removed, extras=None):
    """InfoNCE of each anchor i over the candidates (positive = candidate i) without the (i, c) in ``removed``."""
    rows = []
    for i in range(anchors.shape[0]):
        logits, target = [], None
        for c in range(candidates.shape[0]):
            if (i, c) in removed:
                continue
            if c == i:
                target = len(logits)
            logits.append(cosf(anchors[i], candidates[c]) / TAU)
        logits += [e / TAU for e in (extras[i] if extras is not None else [])]
        rows.append(ce(logits, target))
    return rows


def focal(s: float, positive: bool, m: float = 0.3) -> float:
    """A Focal-InfoNCE logit: s² / τ for the positive, s (s + m) / τ for a negative."""
    return (s * s if positive else s * (s + m)) / TAU


def focal_rows(anchors, candidates, removed, m=0.3):
    """Focal-InfoNCE of each anchor i over the candidates (positive = candidate i) without the (i, c) in
    ``removed``."""
    rows = []
    for i in range(anchors.shape[0]):
        kept = [c for c in range(candidates.shape[0]) if (i, c) not in removed]
        logits = [focal(cosf(anchors[i], candidates[c]), c == i, m) for c in kept]
        rows.append(ce(logits, kept.index(i)))
    return rows


# ------------------------------------------------------------------------------------------------ the index
def test_index_marks_exactly_its_pairs():
    index = KnownPositives(torch.tensor([5, 5, 7]), torch.tensor([50, 51, 50]))
    mask = index.mask(torch.tensor([5, 7, 9]), torch.tensor([50, 51, 52, 5]))
    expected = torch.tensor([[True, True, False, False], [True, False, False, False], [False] * 4])
    assert torch.equal(mask, expected)
    assert index.num_pairs == 3 and index.memory_bytes == (2 + 2 + 3) * 8
    assert torch.equal(index.known_anchors(torch.tensor([7, 50])), torch.tensor([True, False]))


def test_index_from_texts_uses_the_keys_forward_computes(tiny_model):
    mapping = {"a man plays the guitar.": {"the sun is hot.", "snow is cold."}}
    index = KnownPositives.from_mapping(mapping, tiny_model.preprocess)
    texts = ["a man plays the guitar.", "the sun is hot.", "snow is cold.", "the sky is blue."]
    keys = text_keys([tiny_model.tokenize(texts)])[0]
    assert torch.equal(index.mask(keys[:1], keys), torch.tensor([[False, True, True, False]]))
    assert not bool(index.mask(keys[1:], keys).any())  # relevance is directed: anchor → texts


# ------------------------------------------------------------------------------------------------ every loss
def _losses(tiny_model):
    return {
        "focal": lambda **kw: FocalInfoNCELoss(None, m=0.3, **kw),
        "mixcse-hardest": lambda **kw: MixCSELoss(None, partner="hardest", lam=0.5, **kw),
        "mixcse-shift": lambda **kw: MixCSELoss(None, partner="shift", lam=0.5, **kw),
        "mixcse-official": lambda **kw: MixCSELoss(None, layout="official", reverse_mix=False, **kw),
        "hncse-both": lambda **kw: HNCSELoss(None, mode="both", k=3, num_mixed=4, seed=0,
                                             hnm_pool="all_negatives", **kw),
        "hncse-single": lambda **kw: HNCSELoss(None, mode="hnm", hnm_single=True, k=2, **kw),
        "adcse": lambda **kw: AdversarialNegativesLoss(tiny_model, num_adversaries=2, untied=False, seed=1,
                                                       adversary_lr=0.0, **kw),
    }


@pytest.mark.parametrize("name", ["focal", "mixcse-hardest", "mixcse-shift", "mixcse-official", "hncse-both",
                                  "hncse-single", "adcse"])
def test_a_mapping_of_exactly_the_duplicates_is_duplicate_masking(tiny_model, name):
    """Duplicates masked by text and the same pairs masked by the mapping (texts distinct) give the same loss and
    gradient to 1e-6: the mapping's candidates leave the denominator, the partners and the pools as duplicates do.
    Without either the loss differs."""
    make = _losses(tiny_model)[name]
    d = tiny_model.get_embedding_dimension() if name == "adcse" else 8
    cols = columns(d=d)

    def run(keys, **kw):
        loss = make(temperature=0.5, **kw)  # a warm softmax: every masked entry moves the loss visibly
        leaves = [c.clone().requires_grad_(True) for c in cols]
        loss.set_false_negative_inputs(text_keys=keys)
        value = loss.compute_loss_from_embeddings(leaves, None)
        value.backward()
        return value.detach(), [leaf.grad for leaf in leaves], loss.diagnostics

    duplicates, grads_d, _ = run(DUPLICATED)
    known, grads_k, stats = run(DISTINCT, known_positives=known_like_the_duplicates())
    plain, _, _ = run(DISTINCT)
    torch.testing.assert_close(known, duplicates, rtol=0, atol=1e-6)
    for a, b in zip(grads_k, grads_d, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    assert abs(float(plain) - float(duplicates)) > 1e-3
    assert stats["masked_known_positives_total"] == 3.0
    assert stats["masked_false_negatives_total"] == 3.0


def test_each_known_candidate_leaves_its_anchors_denominator():
    """The rows equal the hand-written Focal-InfoNCE without the mapped pairs, duplicates of the texts masked once
    (a candidate both duplicate and mapped counts once in the total)."""
    cols = columns()
    keys = DUPLICATED  # pair (1, 3) is a duplicate, and also mapped below
    # text 11 is positive 1 (never masked for anchor 1) and positive 3; text 10 is positive 0 and the negative of
    # pair 4 (column 10); text 23 is the negative of pair 3 (column 9); text 25 is pair 5's own mined negative
    index = KnownPositives(torch.tensor([1, 2, 2, 5]), torch.tensor([11, 10, 23, 25]))
    loss = FocalInfoNCELoss(None, m=0.3, temperature=TAU, known_positives=index)
    loss.set_false_negative_inputs(text_keys=keys)
    value = loss.compute_loss_from_embeddings(cols, None).item()
    known = {(1, 3), (2, 0), (2, 10), (2, 9), (5, 11)}
    removed = DUPLICATE_PAIRS | known
    candidates = torch.cat([cols[1], cols[2]])
    assert value == pytest.approx(sum(focal_rows(cols[0], candidates, removed)) / 6, rel=1e-9)
    stats = loss.diagnostics
    assert stats["masked_known_positives_total"] == len(known) == 5
    assert stats["masked_false_negatives_total"] == len(removed) == 7  # (1, 3) is a duplicate too: counted once


def test_a_known_candidate_is_never_the_hardest_partner_or_in_the_pool():
    """The candidate closest to anchor 0 is mapped: MixCSE's hardest partner and HNCSE's single hardest negative
    are then the next one, as written out here."""
    cols = columns(num=2, seed=3)
    n = 6
    sims = [[cosf(cols[0][i], cols[1][c]) for c in range(n)] for i in range(n)]
    hardest = max((c for c in range(n) if c != 0), key=lambda c: sims[0][c])
    index = KnownPositives(torch.tensor([0]), torch.tensor([10 + hardest]))
    keys = DISTINCT[:2]
    removed = {(0, hardest)}

    def allowed(i):
        return [c for c in range(n) if c != i and (i, c) not in removed]

    partner = [max(allowed(i), key=lambda c: sims[i][c]) for i in range(n)]
    mixed = [cosf(cols[0][i], unit(0.5 * unit(cols[1][i]) + 0.5 * unit(cols[1][partner[i]]))) for i in range(n)]
    mix = MixCSELoss(None, partner="hardest", lam=0.5, temperature=TAU, known_positives=index)
    mix.set_false_negative_inputs(text_keys=keys)
    got = mix.compute_loss_from_embeddings(cols, None).item()
    expected = infonce_rows(cols[0], cols[1], removed, extras=[[m] for m in mixed])
    assert got == pytest.approx(sum(expected) / n, rel=1e-9)
    single = HNCSELoss(None, mode="hnm", hnm_single=True, k=1, temperature=TAU, known_positives=index)
    single.set_false_negative_inputs(text_keys=keys)
    got = single.compute_loss_from_embeddings(cols, None).item()
    expected = infonce_rows(cols[0], cols[1], removed, extras=[[sims[i][partner[i]]] for i in range(n)])
    assert got == pytest.approx(sum(expected) / n, rel=1e-9)


def test_doc_to_query_and_query_to_query_mask_the_mapped_rows():
    """Symmetric Focal-InfoNCE with query_to_query: positive i against query j is masked when doc i is mapped to
    query j's anchor (the transposed mask), and query j against query i when j's text is mapped to anchor i."""
    cols = columns(num=2, seed=5)
    n = 6
    index = KnownPositives(torch.tensor([0, 4]), torch.tensor([12, 1]))  # doc 2 → anchor 0; anchor 1 → anchor 4
    loss = FocalInfoNCELoss(None, m=0.3, temperature=TAU, known_positives=index, mask_duplicates=False,
                            directions=("query_to_doc", "doc_to_query", "query_to_query"))
    loss.set_false_negative_inputs(text_keys=DISTINCT[:2])
    got = loss.compute_loss_from_embeddings(cols, None).item()
    rows = []
    for i in range(n):
        logits = [focal(cosf(cols[0][i], cols[1][c]), c == i) for c in range(n) if not (i == 0 and c == 2)]
        target = i  # the only removed entry of a row (2 for row 0) comes after its positive
        logits += [focal(cosf(cols[1][i], cols[0][j]), j == i) for j in range(n) if not (i == 2 and j == 0)]
        logits += [focal(cosf(cols[0][i], cols[0][j]), False) for j in range(n) if j != i and not (i == 4 and j == 1)]
        rows.append(ce(logits, target))
    assert got == pytest.approx(sum(rows) / n, rel=1e-9)


def test_a_mapping_that_marks_every_candidate_refuses_the_batch_and_names_itself():
    cols = columns(num=2)
    n = 6
    anchors = torch.arange(n).repeat_interleave(n - 1)
    documents = torch.tensor([10 + c for i in range(n) for c in range(n) if c != i])
    loss = FocalInfoNCELoss(None, m=0.3, known_positives=KnownPositives(anchors, documents))
    loss.set_false_negative_inputs(text_keys=DISTINCT[:2])
    with pytest.raises(ValueError, match=r"no usable row in this batch: 6 of 6 rows .*known_positives"):
        loss.compute_loss_from_embeddings(cols, None)


# ------------------------------------------------------------------------------------------------ the queue
def test_a_queued_candidate_known_relevant_to_the_anchor_is_masked():
    model = nn.Linear(4, 4)
    index = KnownPositives(torch.tensor([30]), torch.tensor([12]))  # anchor text 30 ← step 0's third positive
    loss = FocalInfoNCELoss(model, m=0.3, temperature=TAU, queue_size=8, known_positives=index)
    g = torch.Generator().manual_seed(0)
    first = [torch.randn(3, 4, generator=g), torch.randn(3, 4, generator=g)]
    second = [torch.randn(3, 4, generator=g), torch.randn(3, 4, generator=g)]
    loss.set_false_negative_inputs(text_keys=torch.tensor([[0, 1, 2], [10, 11, 12]]))
    with pytest.warns(UserWarning, match="none of the 3 anchors"):  # anchor 30 only comes in the second batch
        loss.compute_loss_from_embeddings(first, None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    model.weight.grad = torch.zeros_like(model.weight)
    optimizer.step()
    loss.set_false_negative_inputs(text_keys=torch.tensor([[40, 30, 41], [50, 51, 52]]))
    got = loss.compute_loss_from_embeddings(second, None).item()
    a, p, q = second[0], second[1], first[1]
    rows = []
    for i in range(3):
        logits = [focal(cosf(a[i], p[c]), c == i) for c in range(3)]
        logits += [focal(cosf(a[i], q[j]), False) for j in range(3) if not (i == 1 and j == 2)]
        rows.append(ce(logits, i))
    assert got == pytest.approx(sum(rows) / 3, rel=1e-5)
    assert loss.diagnostics["queue_known_positives_masked_total"] == 1.0
    assert loss.diagnostics["queue_rows_masked"] == pytest.approx(1 / 3)


# ------------------------------------------------------------------------------------------------ real model
MAPPING = {"a man plays the guitar.": {"rain in the city at night.", "she writes a letter."},
           "the cat eats food.": {"the sun is hot."}}
TEXTS = [["a man plays the guitar.", "a woman plays the piano.", "the dog runs in the park.", "the cat eats food.",
          "children read a book.", "the sky is blue.", "people walk to the station.", "one car drives on the road."],
         ["the sun is hot.", "rain in the city at night.", "two children eat bread.", "a train at the station.",
          "the house is red.", "she writes a letter.", "snow is cold.", "three apples and water."]]


def make_known_mixcse(model):
    return MixCSELoss(model, partner="hardest", known_positives=MAPPING, gather_across_devices=True)


def make_known_mixcse_cached(model):
    return MixCSELoss(model, partner="hardest", known_positives=MAPPING, gather_across_devices=True,
                      mini_batch_size=3)


def make_known_hncse(model):
    return HNCSELoss(model, mode="both", k=3, num_mixed=4, seed=0, known_positives=MAPPING,
                     gather_across_devices=True)


def make_plain_mixcse(model):
    return MixCSELoss(model, partner="hardest", gather_across_devices=True)


def test_forward_masks_the_mapped_texts_and_reports_them(tiny_model):
    loss = make_known_mixcse(tiny_model)
    tiny_model.eval()
    loss([tiny_model.tokenize(TEXTS[0]), tiny_model.tokenize(TEXTS[1])], None)
    # anchor 0 ← positives 1 and 5, anchor 3 ← positive 0
    assert loss.diagnostics["masked_known_positives_total"] == 3.0
    assert loss.get_config_dict()["known_positives"] == 3


def test_cached_equals_uncached_equals_gathered(tiny_model_dir, tmp_path):
    from st_hardneg.testing.distributed import model_step, spawn_jobs

    single, grads = model_step(0, 1, make_known_mixcse, str(tiny_model_dir), TEXTS)
    cached, cached_grads = model_step(0, 1, make_known_mixcse_cached, str(tiny_model_dir), TEXTS)
    plain, _ = model_step(0, 1, make_plain_mixcse, str(tiny_model_dir), TEXTS)
    assert cached == pytest.approx(single, abs=1e-6)
    for name, grad in grads.items():
        if grad is not None:
            torch.testing.assert_close(cached_grads[name], grad, rtol=0, atol=1e-6)
    assert abs(plain - single) > 1e-4  # the mapping changed the loss
    hncse_single, hncse_grads = model_step(0, 1, make_known_hncse, str(tiny_model_dir), TEXTS)
    jobs = [(model_step, (make, str(tiny_model_dir), TEXTS))
            for make in (make_known_mixcse, make_known_mixcse_cached, make_known_hncse)]
    results = spawn_jobs(jobs, tmp_path / "spawn")
    for ranks, (loss, reference) in zip(results, [(single, grads), (single, grads), (hncse_single, hncse_grads)],
                                        strict=True):
        assert sum(r[0] for r in ranks) / 2 == pytest.approx(loss, abs=1e-6)
        for name, grad in reference.items():
            if grad is not None:
                torch.testing.assert_close(ranks[0][1][name], grad, rtol=0, atol=1e-6)


# ------------------------------------------------------------------------------------------------ bad input
def test_an_empty_mapping_warns_and_is_the_loss_without_it(tiny_model):
    with pytest.warns(UserWarning, match="known_positives is empty"):
        loss = FocalInfoNCELoss(tiny_model, m=0.3, known_positives={})
    assert loss.known_positives is None
    tiny_model.eval()
    features = [tiny_model.tokenize(TEXTS[0]), tiny_model.tokenize(TEXTS[1])]
    plain = FocalInfoNCELoss(tiny_model, m=0.3)
    assert loss(features, None).item() == plain(features, None).item()


@pytest.mark.parametrize("mapping,error,match", [
    ({1: {"a"}}, TypeError, "key 1"),
    ({"a": "b"}, TypeError, "is the string"),
    ({"a": {2}}, TypeError, "holds 2"),
    (["a", "b"], TypeError, "must map anchor texts"),
])
def test_bad_mappings_are_refused_naming_the_entry(tiny_model, mapping, error, match):
    with pytest.raises(error, match=match):
        FocalInfoNCELoss(tiny_model, known_positives=mapping)


def test_the_functional_path_without_text_keys_is_refused():
    loss = FocalInfoNCELoss(None, known_positives=KnownPositives(torch.tensor([0]), torch.tensor([1])))
    with pytest.raises(ValueError, match="known_positives needs the rows' texts"):
        loss.compute_loss_from_embeddings(columns(num=2), None)


def test_texts_from_a_mapping_need_a_model_with_preprocess():
    with pytest.raises(ValueError, match="preprocess"):
        FocalInfoNCELoss(None, known_positives={"a": {"b"}})


def test_a_first_batch_with_no_mapped_anchor_warns_once(tiny_model):
    loss = FocalInfoNCELoss(tiny_model, known_positives={"not in the data.": {"nor this."}})
    features = [tiny_model.tokenize(TEXTS[0]), tiny_model.tokenize(TEXTS[1])]
    with pytest.warns(UserWarning, match="none of the 8 anchors of the first batch is a key of known_positives"):
        loss(features, None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loss(features, None)


def test_the_false_negative_log_counts_the_known_positives_apart(tiny_model):
    from st_hardneg.training.callbacks import FalseNegativeLog

    loss = make_known_mixcse(tiny_model)
    log = FalseNegativeLog(loss)
    tiny_model.eval()
    features = [tiny_model.tokenize(TEXTS[0]), tiny_model.tokenize(TEXTS[1])]
    for _ in range(2):
        loss(features, None)
        log.on_step_end(None, None, None)
    assert log.known_per_step == [3.0, 3.0]
    summary = log.summary()
    assert summary["known_masked_total"] == 6.0 and summary["known_masked_per_batch"] == 3.0
    assert summary["masked_total"] == 6.0  # nothing else masked in this batch
    assert "known_masked_total" not in FalseNegativeLog(make_plain_mixcse(tiny_model)).summary()
