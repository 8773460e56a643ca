"""sentence-transformers as the oracle: every st-hardneg loss reduces to ST's MNRL family where its paper allows.

- AdCSE without adversaries and with tied keys is ``MultipleNegativesRankingLoss`` for every ``scale``,
  ``similarity_fct``, ``directions``, ``partition_mode`` and ``hardness_mode``, with and without explicit negatives;
  with ``mini_batch_size`` it is ``CachedMultipleNegativesRankingLoss``; with a guide it is ``GISTEmbedLoss`` (and
  ``CachedGISTEmbedLoss``); with ``gather_across_devices`` on 2 gloo processes it is MNRL gathering too. Loss and
  gradients to 1e-6. All four losses share the code that builds ST's blocks, so this pins it for all of them.
- HNCSE-PM with ``pm_threshold=0`` on pairs whose positive is each anchor's nearest candidate mixes nothing: MNRL.
- MixCSE and Focal-InfoNCE have no exact reduction: their logits are checked per direction against ST's similarity
  matrices (``util.cos_sim`` / ``dot_score``) with the paper's column / modulation added in the test.

Every case compares with a value ST computes (or its similarity functions), so an argument that were accepted but
ignored would make the two differ; the grid includes values that change the loss (checked too).
"""

from __future__ import annotations

import functools
import itertools
import unittest.mock
import warnings

import pytest
import torch
from sentence_transformers import util
from sentence_transformers.sentence_transformer.losses import (
    CachedGISTEmbedLoss,
    CachedMultipleNegativesRankingLoss,
    GISTEmbedLoss,
    MultipleNegativesRankingLoss,
    MultipleNegativesSymmetricRankingLoss,
)

from st_hardneg import AdversarialNegativesLoss, FocalInfoNCELoss, HNCSELoss, MixCSELoss
from st_hardneg.models import load_model
from st_hardneg.testing import make_tiny_model_dir
from st_hardneg.testing.distributed import gathered_loss_job, spawn_jobs

N, DIM = 6, 8
#: every directions tuple ST's docstring shows, plus the two same-type terms alone
DIRECTIONS = [("query_to_doc",), ("query_to_doc", "doc_to_query"),
              ("query_to_doc", "query_to_query", "doc_to_query", "doc_to_doc"),
              ("query_to_doc", "query_to_query"), ("query_to_doc", "doc_to_doc")]
HARDNESS = [(None, 0.0), ("in_batch_negatives", 9.0), ("hard_negatives", 5.0), ("all_negatives", 5.0)]
SIMILARITIES = {"cos_sim": util.cos_sim, "dot_score": util.dot_score}


def grid():
    for scale, sim, directions, partition, (mode, strength), columns in itertools.product(
            (20.0, 50.0), SIMILARITIES, DIRECTIONS, ("joint", "per_direction"), HARDNESS, (2, 4)):
        if partition == "per_direction" and {"query_to_query", "doc_to_doc"} & set(directions):
            continue  # ST rejects it (and so do we: test_per_direction_with_same_type_terms_is_rejected)
        yield scale, sim, directions, partition, mode, strength, columns


GRID = list(grid())


def embeddings(columns: int, seed: int = 0, scale_rows: bool = True) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    cols = [torch.randn(N, DIM, generator=g) for _ in range(columns)]
    if scale_rows:  # unequal norms: dot products and cosines differ
        cols = [c * torch.linspace(0.3, 1.2, N).unsqueeze(1) for c in cols]
    return cols


def loss_and_grads(loss, cols):
    leaves = [c.clone().requires_grad_(True) for c in cols]
    value = loss.compute_loss_from_embeddings(leaves, None)
    value.backward()
    return value.detach(), [leaf.grad for leaf in leaves]


def st_options(scale, sim, directions, partition, mode, strength):
    return dict(scale=scale, similarity_fct=SIMILARITIES[sim], directions=directions, partition_mode=partition,
                hardness_mode=mode, hardness_strength=strength)


def adcse_reduction(model=None, guide=None, **options):
    """AdCSE's documented reduction to ST: no adversaries, tied keys, no duplicate mask (ST has none)."""
    return AdversarialNegativesLoss(model if model is not None else torch.nn.Linear(1, 1), guide, num_adversaries=0,
                                    untied=False, mask_duplicates=False, **options)


def largest_logit(cols, scale, sim="cos_sim", strength=0.0):
    """The largest logit magnitude of a case: float32 resolves a logit L to about 1e-7·L, so two correct float32
    implementations that add in different orders agree to about 1e-6·L, not to 1e-6 absolute."""
    if sim == "cos_sim":
        return scale + strength
    norms = torch.stack([c.norm(dim=1).max() for c in cols])
    return float(norms.max() ** 2 * (scale + strength))


def assert_same(ours, theirs, logit: float = 1.0):
    """Loss and gradients equal to 1e-6, relative to the largest logit ``logit`` (float32 resolution; 1 for cosine
    logits up to 1) and to each entry's own size."""
    (value, grads), (want, want_grads) = ours, theirs
    atol = 1e-6 * max(1.0, logit)
    torch.testing.assert_close(value, want, rtol=1e-6, atol=atol)
    for got, expected in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-6, atol=atol)


# ------------------------------------------------------------------------------------------ the MNRL family
@pytest.mark.parametrize("case", GRID, ids=["-".join(map(str, c)).replace("query_to_", "q").replace("doc_to_", "d")
                                            for c in GRID])
def test_adcse_reduction_equals_mnrl(case):
    scale, sim, directions, partition, mode, strength, columns = case
    options = st_options(scale, sim, directions, partition, mode, strength)
    cols = embeddings(columns)
    ours = loss_and_grads(adcse_reduction(**options), cols)
    assert_same(ours, loss_and_grads(MultipleNegativesRankingLoss(None, **options), cols),
                largest_logit(cols, scale, sim, strength))


def test_the_grid_changes_the_loss():
    """Each argument of the grid changes the value (so equality with ST is not equality of constants)."""
    cols = embeddings(4)
    base = dict(scale=20.0, similarity_fct=util.cos_sim, directions=("query_to_doc",), partition_mode="joint")
    reference = loss_and_grads(adcse_reduction(**base), cols)[0]
    for change in ({"scale": 50.0}, {"similarity_fct": util.dot_score}, {"directions": DIRECTIONS[1]},
                   {"directions": DIRECTIONS[1], "partition_mode": "per_direction"},
                   {"hardness_mode": "all_negatives", "hardness_strength": 5.0}):
        assert abs(float(loss_and_grads(adcse_reduction(**{**base, **change}), cols)[0]) - float(reference)) > 1e-4


@pytest.mark.parametrize("scale", [20.0, 50.0])
@pytest.mark.parametrize("sim", list(SIMILARITIES))
@pytest.mark.parametrize("columns", [2, 3])
def test_symmetric_form_equals_multiple_negatives_symmetric_ranking_loss(scale, sim, columns):
    cols = embeddings(columns)
    ours = adcse_reduction(scale=scale, similarity_fct=SIMILARITIES[sim], directions=("query_to_doc", "doc_to_query"),
                           partition_mode="per_direction")
    theirs = MultipleNegativesSymmetricRankingLoss(None, scale=scale, similarity_fct=SIMILARITIES[sim])
    assert_same(loss_and_grads(ours, cols), loss_and_grads(theirs, cols), largest_logit(cols, scale, sim))


def test_hncse_pm_without_mixing_equals_mnrl():
    """pm_threshold=0 mixes only a positive that is not the anchor's nearest candidate; on dropout-like pairs (the
    positive is the anchor plus small noise) no positive is mixed and HNCSE-PM is MNRL."""
    g = torch.Generator().manual_seed(1)
    anchors = torch.randn(N, DIM, generator=g)
    cols = [anchors, anchors + 0.05 * torch.randn(N, DIM, generator=g), torch.randn(N, DIM, generator=g)]
    for directions, partition in ((("query_to_doc",), "joint"), (DIRECTIONS[1], "per_direction"), (DIRECTIONS[2], "joint")):
        options = dict(scale=20.0, directions=directions, partition_mode=partition)
        loss = HNCSELoss(None, mode="pm", pm_threshold=0.0, mask_duplicates=False, **options)
        ours = loss_and_grads(loss, cols)
        assert loss.diagnostics["pm_mixed"] == 0.0
        assert_same(ours, loss_and_grads(MultipleNegativesRankingLoss(None, **options), cols), 20.0)


# ------------------------------------------------------------------------------ no exact reduction: the logits
def st_blocks(cols, directions, sim):
    """ST's similarity blocks per direction (its docstring's definitions), with ST's -inf self-masks."""
    fct = SIMILARITIES[sim]
    q, docs = cols[0], torch.cat(cols[1:])
    n = q.size(0)
    blocks = {"query_to_doc": fct(q, docs)}
    if "query_to_query" in directions:
        blocks["query_to_query"] = fct(q, q).masked_fill(torch.eye(n, dtype=torch.bool), float("-inf"))
    if "doc_to_query" in directions:
        blocks["doc_to_query"] = fct(q, cols[1]).T
    if "doc_to_doc" in directions:
        own = torch.eye(n, dtype=torch.bool).repeat(1, len(cols) - 1)
        blocks["doc_to_doc"] = fct(docs, cols[1]).T.masked_fill(own, float("-inf"))
    return blocks


def ranking_loss(logits: dict, positive: torch.Tensor, partition: str) -> torch.Tensor:
    """ST's reduction: one log-sum-exp over every block, or the mean of one per block; minus the positive logit."""
    if partition == "joint":
        log_z = torch.logsumexp(torch.cat(list(logits.values()), 1), 1)
    else:
        log_z = torch.stack([torch.logsumexp(v, 1) for v in logits.values()]).mean(0)
    return (log_z - positive).mean()


FOCAL_CASES = [(d, p, c) for d in DIRECTIONS for p in ("joint", "per_direction") for c in (2, 3)
               if not (p == "per_direction" and {"query_to_query", "doc_to_doc"} & set(d))]


@pytest.mark.parametrize("directions,partition,columns", FOCAL_CASES)
@pytest.mark.parametrize("scale", [20.0, 50.0])
def test_focal_logits_per_direction(directions, partition, columns, scale):
    m = 0.3
    cols = embeddings(columns)
    leaves = [c.clone().requires_grad_(True) for c in cols]
    blocks = st_blocks(leaves, directions, "cos_sim")
    n = N
    eye = torch.eye(n, dtype=torch.bool)
    logits = {}
    for name, s in blocks.items():
        masked = torch.isinf(s)
        s = s.masked_fill(masked, 0.0)
        value = s * (s + m) * scale
        if name in ("query_to_doc", "doc_to_query"):  # the positive at column i: s_p²
            square = torch.zeros_like(value, dtype=torch.bool)
            square[:, :n] = eye
            value = torch.where(square, s * s * scale, value)
        logits[name] = value.masked_fill(masked, float("-inf"))
    positive = logits["query_to_doc"][:, :n].diagonal()
    want = ranking_loss(logits, positive, partition)
    want.backward()
    loss = FocalInfoNCELoss(None, m=m, scale=scale, directions=directions, partition_mode=partition,
                            mask_duplicates=False)
    assert_same(loss_and_grads(loss, cols), (want.detach(), [leaf.grad for leaf in leaves]), scale * (1 + m))


@pytest.mark.parametrize("directions,partition,columns", FOCAL_CASES)
@pytest.mark.parametrize("sim", list(SIMILARITIES))
@pytest.mark.parametrize("mode,strength", [(None, 0.0), ("all_negatives", 5.0)])
def test_mixcse_logits_per_direction(directions, partition, columns, sim, mode, strength):
    """ST's blocks plus one mixed negative per row in query_to_doc (and doc_to_query's own with reverse_mix):
    ``normalize(λ p̂_i + (1-λ) p̂_{i+1})`` for cosines, ``λ p_i + (1-λ) p_{i+1}`` for dot products, detached; the
    hardness penalty on ST's columns only."""
    lam, scale = 0.2, 20.0
    cols = embeddings(columns)
    leaves = [c.clone().requires_grad_(True) for c in cols]
    blocks = st_blocks(leaves, directions, sim)
    shift = torch.arange(1, N + 1) % N
    q, p = leaves[0], leaves[1]
    if sim == "cos_sim":
        unit = torch.nn.functional.normalize
        mix = unit(lam * unit(p, dim=1) + (1 - lam) * unit(p, dim=1)[shift], dim=1).detach()
        reverse = unit(lam * unit(q, dim=1) + (1 - lam) * unit(q, dim=1)[shift], dim=1).detach()
        mix_score = (unit(q, dim=1) * mix).sum(1, keepdim=True)
        reverse_score = (unit(p, dim=1) * reverse).sum(1, keepdim=True)
    else:
        mix_score = (q * (lam * p + (1 - lam) * p[shift]).detach()).sum(1, keepdim=True)
        reverse_score = (p * (lam * q + (1 - lam) * q[shift]).detach()).sum(1, keepdim=True)
    logits = {name: s * scale for name, s in blocks.items()}
    if mode is not None:  # ST's all_negatives penalty: every query_to_doc column but the positive
        penalty = strength * blocks["query_to_doc"].detach()
        penalty[:, :N] = penalty[:, :N].masked_fill(torch.eye(N, dtype=torch.bool), 0.0)
        logits["query_to_doc"] = logits["query_to_doc"] + penalty
    logits["query_to_doc"] = torch.cat([logits["query_to_doc"], mix_score * scale], 1)
    if "doc_to_query" in directions:
        logits["doc_to_query"] = torch.cat([logits["doc_to_query"], reverse_score * scale], 1)
    positive = blocks["query_to_doc"][:, :N].diagonal() * scale
    want = ranking_loss(logits, positive, partition)
    want.backward()
    loss = MixCSELoss(None, lam=lam, scale=scale, similarity_fct=SIMILARITIES[sim], directions=directions,
                      partition_mode=partition, hardness_mode=mode, hardness_strength=strength,
                      mask_duplicates=False)
    assert loss.reverse_mix == ("doc_to_query" in directions)
    assert_same(loss_and_grads(loss, cols), (want.detach(), [leaf.grad for leaf in leaves]),
                largest_logit(cols, scale, sim, strength))


# ---------------------------------------------------------------------------- models: Cached*, GIST, CachedGIST
@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("parity-models")
    model = load_model(make_tiny_model_dir(root / "model", seed=0), pooling="mean", max_seq_length=16, device="cpu")
    guide = load_model(make_tiny_model_dir(root / "guide", seed=1), pooling="mean", max_seq_length=16, device="cpu")
    model.eval()  # no dropout: the cached and uncached forwards see the same embeddings
    guide.eval()
    return model, guide


TEXTS = ["the cat sat on the mat.", "a man plays a guitar.", "the sky is blue today.", "children read a book.",
         "a car drives on the road.", "people walk to the station."]
POSITIVES = ["a cat is on the mat.", "the man is playing guitar.", "today the sky is blue.", "kids are reading.",
             "a car on the road.", "people go to the station."]
NEGATIVES = ["a dog runs in the park.", "the sun is shining.", "a woman slices an onion.", "the train is late.",
             "birds sing in the morning.", "the river flows to the sea."]


def features(model, columns: int):
    texts = [TEXTS, POSITIVES, NEGATIVES][:columns]
    return [model.preprocess(column) for column in texts]


def forward_and_grads(loss, model, columns):
    model.zero_grad()
    value = loss(features(model, columns), None)
    value.backward()
    grads = [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad()
    return value.detach(), grads


@pytest.mark.parametrize("directions,partition", [(("query_to_doc",), "joint"), (DIRECTIONS[1], "per_direction"),
                                                  (DIRECTIONS[2], "joint")])
@pytest.mark.parametrize("columns", [2, 3])
def test_cached_reduction_equals_cached_mnrl(tiny_pair, directions, partition, columns):
    model, _ = tiny_pair
    options = dict(scale=20.0, directions=directions, partition_mode=partition, mini_batch_size=2)
    ours = forward_and_grads(adcse_reduction(model, **options), model, columns)
    theirs = forward_and_grads(CachedMultipleNegativesRankingLoss(model, **options), model, columns)
    uncached = forward_and_grads(MultipleNegativesRankingLoss(
        model, scale=20.0, directions=directions, partition_mode=partition), model, columns)
    assert_same(ours, theirs, 20.0)
    assert_same(ours, uncached, 20.0)


@pytest.mark.parametrize("margin_strategy,margin", [("absolute", 0.0), ("absolute", 0.1), ("relative", 0.05)])
@pytest.mark.parametrize("contrast_anchors,contrast_positives", [(True, True), (False, True), (True, False),
                                                                 (False, False)])
@pytest.mark.parametrize("columns", [2, 3])
def test_guided_reduction_equals_gist(tiny_pair, margin_strategy, margin, contrast_anchors, contrast_positives,
                                      columns):
    model, guide = tiny_pair
    options = dict(temperature=0.05, margin_strategy=margin_strategy, margin=margin,
                   contrast_anchors=contrast_anchors, contrast_positives=contrast_positives)
    loss = adcse_reduction(model, guide=guide, **options)
    theirs = forward_and_grads(GISTEmbedLoss(model, guide, **options), model, columns)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the random tiny guide leaves some rows without negatives (warned)
            ours = forward_and_grads(loss, model, columns)
    except ValueError as error:  # every negative masked: GIST silently returns 0 and no gradient, ours refuses
        assert "no usable row in this batch: 6 of 6 rows of a batch have no negative left" in str(error)
        assert float(theirs[0]) == 0.0 and all(float(g.abs().max()) == 0.0 for g in theirs[1])
        return
    assert_same(in_gist_mean(ours, loss), theirs, 20.0)
    if margin == 0.0:  # every row keeps a negative on these batches: the very same numbers
        assert "rows_without_negatives" not in loss.diagnostics or loss.diagnostics["rows_without_negatives"] == 0
        assert_same(ours, theirs, 20.0)


def in_gist_mean(result, loss, n: int = len(TEXTS)):
    """GISTEmbedLoss keeps a row whose every negative is masked in its mean as a 0; ours leaves it out (one rule for
    unusable rows). On a batch with ``e`` such rows ours × (n - e) / n is GIST's loss and gradient."""
    value, grads = result
    factor = (n - loss.diagnostics.get("rows_without_negatives", 0.0)) / n
    return value * factor, [g * factor for g in grads]


def test_the_gist_grid_has_batches_with_rows_without_negatives(tiny_pair):
    """The rescaling above is exercised: margin 0.1 leaves rows of these batches without a negative, and ours is
    then GIST's mean over the usable rows, not GIST's mean over all rows."""
    model, guide = tiny_pair
    options = dict(temperature=0.05, margin=0.1, contrast_anchors=True, contrast_positives=False)
    loss = adcse_reduction(model, guide=guide, **options)
    with pytest.warns(UserWarning, match=r"rows of a batch have no negative left.*left out of the batch's mean"):
        ours = forward_and_grads(loss, model, 2)
    theirs = forward_and_grads(GISTEmbedLoss(model, guide, **options), model, 2)
    empty = loss.diagnostics["rows_without_negatives"]
    assert 0 < empty < len(TEXTS)
    assert float(ours[0]) == pytest.approx(float(theirs[0]) * len(TEXTS) / (len(TEXTS) - empty), rel=1e-6)
    assert float(ours[0]) != pytest.approx(float(theirs[0]), rel=1e-3)


def test_gist_defaults_with_a_positional_guide(tiny_pair):
    """GISTEmbedLoss(model, guide) → ours(model, guide): margin 0 and both contrast blocks on, as in GIST."""
    model, guide = tiny_pair
    loss = adcse_reduction(model, guide, temperature=0.01)
    assert (loss.margin, loss.contrast_anchors, loss.contrast_positives) == (0.0, True, True)
    assert_same(forward_and_grads(loss, model, 3),
                forward_and_grads(GISTEmbedLoss(model, guide, temperature=0.01), model, 3), 100.0)


def test_cached_guided_reduction_equals_cached_gist(tiny_pair):
    model, guide = tiny_pair
    loss = adcse_reduction(model, guide, temperature=0.05, margin=0.05, mini_batch_size=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours = forward_and_grads(loss, model, 3)
    theirs = forward_and_grads(CachedGISTEmbedLoss(model, guide, temperature=0.05, margin=0.05, mini_batch_size=2),
                               model, 3)
    assert_same(in_gist_mean(ours, loss), theirs, 20.0)


# ------------------------------------------------------------------------------ gather_across_devices, 2 procs
GATHER_CASES = [(("query_to_doc",), "joint", None), (DIRECTIONS[1], "per_direction", None),
                (DIRECTIONS[2], "joint", "in_batch_negatives"), (("query_to_doc",), "joint", "hard_negatives")]


@pytest.mark.distributed
def test_gathered_reduction_equals_gathered_mnrl(tmp_path):
    cols = embeddings(3)
    jobs = []
    for directions, partition, mode in GATHER_CASES:
        options = dict(scale=20.0, directions=directions, partition_mode=partition, hardness_mode=mode,
                       hardness_strength=5.0 if mode else 0.0, gather_across_devices=True)
        ours = functools.partial(adcse_reduction, **options)
        theirs = functools.partial(MultipleNegativesRankingLoss, None, **options)
        jobs += [gathered_loss_job(ours, cols), gathered_loss_job(theirs, cols)]
    results = spawn_jobs(jobs, tmp_path)
    for ours, theirs in zip(results[::2], results[1::2], strict=True):
        for (value, grads), (want, want_grads) in zip(ours, theirs, strict=True):  # rank by rank
            limit = largest_logit(cols, 20.0, "cos_sim", 5.0)
            assert_same((torch.tensor(value), grads), (torch.tensor(want), want_grads), limit)


# ------------------------------------------------------------------------------------------ constructor traps
@pytest.mark.parametrize("cls", [MixCSELoss, FocalInfoNCELoss, HNCSELoss])
def test_a_positional_scale_is_a_type_error_naming_scale(cls):
    with pytest.raises(TypeError, match=r"scale=20\.0.*temperature=20\.0"):
        cls(None, 20.0)


def test_a_positional_scale_on_adcse_too():
    with pytest.raises(TypeError, match="keyword-only"):
        AdversarialNegativesLoss(torch.nn.Linear(1, 1), 20)


@pytest.mark.parametrize("cls", [MixCSELoss, FocalInfoNCELoss, HNCSELoss])
def test_scale_and_temperature(cls):
    assert cls(None, scale=50.0).temperature == pytest.approx(0.02)
    assert cls(None, temperature=0.02).scale == pytest.approx(50.0)
    assert cls(None).scale == pytest.approx(20.0)
    with pytest.raises(ValueError, match="either scale .* or temperature, not both"):
        cls(None, scale=20.0, temperature=0.05)
    with pytest.raises(ValueError, match="scale"):
        cls(None, scale=0.0)
    with pytest.warns(UserWarning, match="temperature=20.0 means a temperature of 20.*Did you mean scale=20.0"):
        cls(None, temperature=20.0)
    with pytest.warns(UserWarning, match="scale=0.5 means a temperature of 2"):
        cls(None, scale=0.5)


@pytest.mark.parametrize("cls,reason", [(FocalInfoNCELoss, "s_p²"), (HNCSELoss, "ratio")])
def test_cosine_only_losses_reject_dot_score_with_a_reason(cls, reason):
    with pytest.raises(ValueError, match=f"needs similarity_fct=cos_sim.*{reason}"):
        cls(None, similarity_fct=util.dot_score)


def test_adcse_rejects_dot_score_only_with_adversaries():
    with pytest.raises(ValueError, match="unit sphere"):
        AdversarialNegativesLoss(torch.nn.Linear(1, 1), num_adversaries=4, similarity_fct=util.dot_score)
    assert adcse_reduction(similarity_fct=util.dot_score).similarity_fct is util.dot_score


@pytest.mark.parametrize("kwargs,match", [
    ({"similarity_fct": torch.nn.functional.cosine_similarity}, "similarity_fct must be"),
    ({"directions": "query_to_doc"}, "directions must be a tuple"),
    ({"directions": ("doc_to_query",)}, "must include 'query_to_doc'"),
    ({"directions": ("query_to_doc", "query_to_doc")}, "must not repeat"),
    ({"directions": ("query_to_doc", "sideways")}, "directions must be a non-empty tuple"),
    ({"partition_mode": "both"}, "partition_mode"),
    ({"hardness_mode": "hardest"}, "hardness_mode"),
    ({"hardness_strength": -1.0}, "hardness_strength"),
    ({"show_progress_bar": "yes"}, "show_progress_bar"),
    ({"contrast_anchors": 1}, "contrast_anchors"),
])
def test_bad_st_arguments_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MixCSELoss(None, **kwargs)


def test_per_direction_with_same_type_terms_is_rejected():
    for directions in (("query_to_doc", "query_to_query"), ("query_to_doc", "doc_to_doc")):
        with pytest.raises(ValueError, match="per_direction"):
            FocalInfoNCELoss(None, directions=directions, partition_mode="per_direction")
    with pytest.raises(ValueError, match="per_direction"):
        FocalInfoNCELoss(None, contrast_anchors=True, partition_mode="per_direction")


def test_hardness_mode_without_strength_warns():
    with pytest.warns(UserWarning, match="hardness_strength=0.0"):
        MixCSELoss(None, hardness_mode="in_batch_negatives")


@pytest.mark.parametrize("old,new", [("symmetric", "directions="), ("false_negative_margin", "margin")])
def test_renamed_arguments_say_their_new_name(old, new):
    with pytest.raises(TypeError, match=f"unexpected keyword argument '{old}'; it is now {new}"):
        MixCSELoss(None, **{old: True if old == "symmetric" else 0.1})


def test_config_shows_every_setting_that_changes_the_loss():
    loss = MixCSELoss(None, scale=50.0, similarity_fct=util.dot_score, directions=DIRECTIONS[1],
                      partition_mode="per_direction", hardness_mode="all_negatives", hardness_strength=5.0,
                      mask_duplicates=False, margin=0.1, margin_strategy="relative", show_progress_bar=True)
    config = loss.get_config_dict()
    assert {key: config[key] for key in ("scale", "similarity_fct", "directions", "partition_mode", "hardness_mode",
                                         "hardness_strength", "mask_duplicates", "margin", "margin_strategy",
                                         "reverse_mix")} == {
        "scale": 50.0, "similarity_fct": "dot_score", "directions": DIRECTIONS[1], "partition_mode": "per_direction",
        "hardness_mode": "all_negatives", "hardness_strength": 5.0, "mask_duplicates": False, "margin": 0.1,
        "margin_strategy": "relative", "reverse_mix": True}
    assert loss.show_progress_bar is True


def test_an_all_masked_batch_is_an_error_and_is_reported():
    cols = embeddings(2, scale_rows=False)
    cols[1] = cols[0][2].repeat(N, 1)  # one positive text for every pair: every candidate duplicates the positive
    loss = FocalInfoNCELoss(None)
    with pytest.raises(ValueError, match=r"no usable row in this batch: 6 of 6 rows of a batch have no negative left"):
        loss.compute_loss_from_embeddings(cols, None)
    assert loss.diagnostics["rows_without_negatives"] == 6.0
    assert loss.diagnostics["masked_fraction"] == 1.0
    cols = embeddings(2, scale_rows=False)
    cols[1] = cols[0] + 0.1 * cols[1]  # positives near their anchors: with margin 0 every other row keeps negatives
    cols[1][0] = -cols[0][0]  # margin 0: row 0's positive is its farthest candidate, every other one is masked
    loss = FocalInfoNCELoss(None, margin=0.0)
    with pytest.warns(UserWarning, match=r"1 of 6 rows of a batch have no negative left"):
        loss.compute_loss_from_embeddings(cols, None)
    assert loss.diagnostics["rows_without_negatives"] == 1.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loss.compute_loss_from_embeddings(cols, None)  # once per loss


# ------------------------------------------------------------------------------------------ ST's wrapper losses
WRAPPED = {
    "mixcse": lambda model: MixCSELoss(model),
    "focal": lambda model: FocalInfoNCELoss(model),
    "hncse": lambda model: HNCSELoss(model, mode="both", k=2, num_mixed=3, seed=0),
    "adcse-untied": lambda model: AdversarialNegativesLoss(model, num_adversaries=4, seed=0),
    "adcse-tied": lambda model: AdversarialNegativesLoss(model, num_adversaries=4, untied=False, seed=0),
}


def truncated_loss(loss, model, width):
    """The loss on the first ``width`` dimensions of every column, normalised (MatryoshkaLoss's ``shrink``), with the
    key encoder's columns for AdCSE's untied form."""
    feats = features(model, 2)
    encoders = [model, getattr(loss, "key_encoder", None) or model]
    with torch.no_grad():
        columns = [encoder(dict(f))["sentence_embedding"] for encoder, f in zip(encoders, feats, strict=True)]
    columns = [torch.nn.functional.normalize(c[:, :width], dim=-1) for c in columns]
    loss.set_false_negative_inputs(text_keys=torch.tensor([[hash(t) for t in TEXTS], [hash(t) for t in POSITIVES]]))
    # called directly, outside MatryoshkaLoss: lift the check that the width is the model's
    with unittest.mock.patch.object(loss, "embedding_dimension", None):
        return float(loss.compute_loss_from_embeddings(columns, None))


@pytest.mark.parametrize("name", list(WRAPPED))
def test_every_loss_trains_inside_matryoshka_loss(tiny_pair, name):
    from sentence_transformers.sentence_transformer.losses import MatryoshkaLoss

    model, _ = tiny_pair
    loss = WRAPPED[name](model)
    if getattr(loss, "key_encoder", None) is not None:  # the key encoder runs in train mode: no dropout, to compare
        for module in loss.key_encoder.modules():
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.0
    with torch.no_grad():
        value = float(MatryoshkaLoss(model, loss, [32, 16], matryoshka_weights=[1.0, 0.5])(features(model, 2), None))
    want = truncated_loss(loss, model, 32) + 0.5 * truncated_loss(loss, model, 16)
    assert value == pytest.approx(want, rel=1e-5)
    # and a training step back-propagates through both dimensions
    model.zero_grad()
    MatryoshkaLoss(model, loss, [32, 16])(features(model, 2), None).backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
    model.zero_grad()


@pytest.mark.parametrize("name", list(WRAPPED))
def test_every_loss_trains_inside_matryoshka2d_and_adaptive_layer_loss(tiny_pair, name):
    from sentence_transformers.sentence_transformer.losses import AdaptiveLayerLoss, Matryoshka2dLoss

    model, _ = tiny_pair
    for wrapper in (Matryoshka2dLoss(model, WRAPPED[name](model), [32, 16], n_layers_per_step=1),
                    AdaptiveLayerLoss(model, WRAPPED[name](model), n_layers_per_step=1)):
        model.zero_grad()
        value = wrapper(features(model, 2), None)
        assert torch.isfinite(value) and value > 0
        value.backward()
        assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
    model.zero_grad()


def test_packed_inputs_keep_the_duplicate_mask(tiny_pair):
    """Packed (flash-attention style) columns: one (1, total) row of token ids cut at ``cu_seq_lens_q``. Their text
    keys equal the padded columns' (so mask_duplicates still sees a repeated text)."""
    from st_hardneg.losses.keys import text_keys

    model, _ = tiny_pair
    texts = [TEXTS[:4], [POSITIVES[0], POSITIVES[1], POSITIVES[0], TEXTS[0]]]
    padded = [model.preprocess(column) for column in texts]
    packed = []
    for features in padded:
        rows = [ids[mask.bool()].tolist() for ids, mask in zip(features["input_ids"], features["attention_mask"],
                                                               strict=True)]
        bounds = torch.tensor([0, *itertools.accumulate(len(r) for r in rows)])
        packed.append({"input_ids": torch.tensor([sum(rows, [])]), "cu_seq_lens_q": bounds})
    keys = text_keys(packed)
    torch.testing.assert_close(keys, text_keys(padded))
    assert keys[1, 0] == keys[1, 2] and keys[1, 3] == keys[0, 0] and len(set(keys[0].tolist())) == 4


# ------------------------------------------------------------------ one word: the class name, in the Trainer
#: how a retrieval team constructs each ST loss (ST's own argument names); ours is the same call, another class
ST_CALLS = {
    "MultipleNegativesRankingLoss": lambda model, guide: ((model,), dict(
        scale=20.0, similarity_fct=util.cos_sim, directions=("query_to_doc", "doc_to_query"),
        partition_mode="per_direction", hardness_mode="in_batch_negatives", hardness_strength=9.0)),
    "CachedMultipleNegativesRankingLoss": lambda model, guide: ((model,), dict(scale=20.0, mini_batch_size=4,
                                                                               show_progress_bar=False)),
    "MultipleNegativesSymmetricRankingLoss": lambda model, guide: ((model,), dict(scale=20.0,
                                                                                  similarity_fct=util.dot_score)),
    "GISTEmbedLoss": lambda model, guide: ((model, guide), dict(temperature=0.05, margin_strategy="absolute",
                                                                margin=0.0, contrast_positives=False)),
    "CachedGISTEmbedLoss": lambda model, guide: ((model, guide), dict(temperature=0.05, mini_batch_size=4)),
}
OURS = {"MixCSELoss": MixCSELoss, "FocalInfoNCELoss": FocalInfoNCELoss, "HNCSELoss": HNCSELoss,
        "AdversarialNegativesLoss": AdversarialNegativesLoss}


@pytest.mark.parametrize("ours", list(OURS))
@pytest.mark.parametrize("st_loss", list(ST_CALLS))
def test_replacing_the_class_name_trains_in_the_trainer(tiny_model_dir, tiny_pair, tiny_sentences, st_loss, ours):
    from datasets import Dataset
    from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments
    from sentence_transformers.sentence_transformer import losses as st_losses

    model = load_model(tiny_model_dir, pooling="cls", max_seq_length=16, device="cpu")
    guide = tiny_pair[1]  # another random tiny BERT
    args, kwargs = ST_CALLS[st_loss](model, guide)
    if ours != "MixCSELoss" and kwargs.get("similarity_fct") is util.dot_score:  # cosine equations say why
        with pytest.raises(ValueError, match="needs similarity_fct=cos_sim"):
            OURS[ours](*args, **kwargs)
        return
    getattr(st_losses, st_loss)(*args, **kwargs)  # the call is valid for ST
    loss = OURS[ours](*args, **kwargs)
    config = loss.get_config_dict()
    for key, value in kwargs.items():  # every argument reached the loss and shows in its config
        if key == "similarity_fct":
            assert config[key] == value.__name__
        elif key != "show_progress_bar":
            assert config[key] == value, key
    data = Dataset.from_dict({"anchor": tiny_sentences[:8], "positive": tiny_sentences[8:16]})
    before = [p.detach().clone() for p in model.parameters()]
    trainer = SentenceTransformerTrainer(model=model, train_dataset=data, loss=loss, args=SentenceTransformerTrainingArguments(
        output_dir=str(tiny_model_dir.parent / f"out-{st_loss}-{ours}"), max_steps=2, per_device_train_batch_size=8,
        learning_rate=1e-3, warmup_steps=0, save_strategy="no", report_to="none", use_cpu=True, disable_tqdm=True,
        logging_steps=1, seed=0))
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == 2 and all(torch.isfinite(torch.tensor(losses)))
    assert any(not torch.equal(a, b.detach()) for a, b in zip(before, model.parameters(), strict=True))
