"""Degenerate batches for all four losses: every example of the issue ends in a clear error or a
warning that names the problem and its counts (through ``warnings`` and ``logging``), and where a value is returned it
equals an independent computation written here.

The rule (``Ranking.unusable_rows``, judged by ``Ranking.judge``): a row whose anchor or positive has a norm below ``NORM_EPS`` is
unusable, and so is a row whose every candidate is masked (no negative left); unusable rows are left out of the mean;
a batch with no usable row is a ``ValueError`` naming the causes and counts; the first batch with unusable rows warns
once per loss instance.
"""

from __future__ import annotations

import logging
import math
import warnings

import pytest
import torch
import torch.nn.functional as F

from st_hardneg import AdversarialNegativesLoss, FocalInfoNCELoss, HNCSELoss, MixCSELoss
from st_hardneg.functional import NORM_EPS

N, D, TAU = 6, 8, 0.05


class SizedModel(torch.nn.Module):
    """A stand-in model: reports its embedding size and has one parameter (AdCSE needs a module with parameters)."""

    def __init__(self, dim: int = D) -> None:
        super().__init__()
        self.dim = dim
        self.weight = torch.nn.Parameter(torch.zeros(1))

    def get_embedding_dimension(self) -> int:
        return self.dim


#: every loss (MixCSE in both layouts), and AdCSE with adversaries and in its MNRL reduction (no adversaries)
FACTORIES = {
    "mixcse": lambda **kw: MixCSELoss(None, **kw),
    "mixcse_official": lambda **kw: MixCSELoss(None, layout="official", **kw),
    "focal": lambda **kw: FocalInfoNCELoss(None, **kw),
    "hncse": lambda **kw: HNCSELoss(None, mode="both", k=3, num_mixed=4, seed=0, **kw),
    "adcse": lambda **kw: AdversarialNegativesLoss(SizedModel(), num_adversaries=4, seed=0, **kw),
    "adcse_mnrl": lambda **kw: AdversarialNegativesLoss(SizedModel(), num_adversaries=0, untied=False, **kw),
}
ALL = list(FACTORIES)
#: the losses in which a row is usable only with a batch candidate left (MixCSE's official layout has a never-masked
#: synthetic column, its mixed anchor against its own positive; AdCSE's adversaries do not make a row usable)
RANKED = ["mixcse", "focal", "hncse", "adcse", "adcse_mnrl"]
NO_NEGATIVE = r"no usable row in this batch: {k} of {k} rows of a batch have no negative left"


def pairs(n: int = N, d: int = D, seed: int = 0, noise: float = 0.3) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    anchors = torch.randn(n, d, generator=g)
    return [anchors, anchors + noise * torch.randn(n, d, generator=g)]


def infonce_rows(anchors, candidates, exclude=None, focal_m=None, tau=TAU):
    """Per-row InfoNCE written out: ``-log e^{l_ii} / Σ_j e^{l_ij}`` over the unmasked candidates, with ``l = cos/τ``
    (Focal-InfoNCE: ``cos²/τ`` for the positive, ``cos (cos + m)/τ`` for the others). A zero row has cosine 0."""
    a = anchors / anchors.norm(dim=1, keepdim=True).clamp_min(NORM_EPS)
    c = candidates / candidates.norm(dim=1, keepdim=True).clamp_min(NORM_EPS)
    cos = a.double() @ c.double().T
    n = cos.size(0)
    if focal_m is None:
        logits = cos / tau
    else:
        logits = cos * (cos + focal_m) / tau
        logits[range(n), range(n)] = cos[range(n), range(n)] ** 2 / tau
    if exclude is not None:
        logits = logits.masked_fill(exclude, float("-inf"))
    out = []
    for i in range(n):
        finite = logits[i][torch.isfinite(logits[i])]
        out.append(float(torch.logsumexp(finite, 0) - logits[i, i]))
    return out


def call(loss, cols):
    return loss.compute_loss_from_embeddings([c.clone() for c in cols], None)


# =============================================================================== zero-norm rows: all of them
@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("scale", [0.0, 1e-20, 1e-9])
def test_a_batch_of_only_zero_norm_rows_is_an_error(name, scale):
    """All-zero embeddings (once 0.0 for MixCSE / Focal / HNCSE and 4.17 for AdCSE) and rows of norm 1e-20 or 1e-9
    (below NORM_EPS = 1e-6): nothing can be ranked, so the batch is refused, naming the cause and the counts."""
    cols = [c * scale for c in pairs()]
    loss = FACTORIES[name]()
    with pytest.raises(ValueError, match=rf"{type(loss).__name__}: no usable row in this batch: .*6 of 6 rows have an "
                                         r"anchor or positive embedding of norm below 1e-06"):
        call(loss, cols)
    assert loss.diagnostics["zero_norm_rows"] == 6.0 and loss.diagnostics["unusable_fraction"] == 1.0


@pytest.mark.parametrize("name", ALL)
def test_zero_anchors_with_healthy_positives_are_an_error_too(name):
    cols = pairs()
    cols[0] = torch.zeros_like(cols[0])
    with pytest.raises(ValueError, match=r"no usable row in this batch: .*6 of 6 rows have an anchor or positive"):
        call(FACTORIES[name](), cols)


@pytest.mark.parametrize("name", ALL)
def test_rows_just_above_the_eps_are_usable(name):
    """NORM_EPS is a norm, not a relative size: rows of norm 1e-5 (10 × eps) are normal rows, scale-invariant."""
    cols = pairs()
    small = [c / c.norm(dim=1, keepdim=True) * 1e-5 for c in cols]
    unit = [c / c.norm(dim=1, keepdim=True) for c in cols]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        value = call(FACTORIES[name](mask_duplicates=False), small).item()
    assert value == pytest.approx(call(FACTORIES[name](mask_duplicates=False), unit).item(), rel=1e-4)


# =============================================================================== zero-norm rows: some of them
@pytest.mark.parametrize("scale", [0.0, 1e-20])
@pytest.mark.parametrize(("name", "focal_m"), [("focal", 0.3), ("adcse_mnrl", None)])
def test_zero_norm_rows_are_left_out_of_the_mean_exactly(name, focal_m, scale):
    """The loss with zero rows 1 (anchor) and 4 (positive) is the mean of the hand-computed InfoNCE of the other 4
    rows; the zero rows stay candidates of the others (cosine 0)."""
    anchors, positives = pairs(noise=1.5)  # losses of order 1: float32 resolves them to 1e-6
    anchors[1] *= scale
    positives[4] *= scale
    loss = FACTORIES[name](mask_duplicates=False)
    with pytest.warns(UserWarning, match=r"2 of 6 rows have an anchor or positive embedding of norm below 1e-06"):
        value = call(loss, [anchors, positives]).item()
    rows = infonce_rows(anchors, positives, focal_m=focal_m)
    expected = sum(rows[i] for i in (0, 2, 3, 5)) / 4
    assert value == pytest.approx(expected, rel=1e-5)
    assert value != pytest.approx(sum(rows) / 6, rel=1e-3)  # the plain mean would differ
    assert loss.diagnostics["zero_norm_rows"] == 2.0
    assert loss.diagnostics["unusable_fraction"] == pytest.approx(2 / 6)


@pytest.mark.parametrize("name", ALL)
def test_one_zero_row_warns_once_per_loss_and_logs(name, caplog):
    cols = pairs()
    cols[0][3] = 0.0
    loss = FACTORIES[name]()
    with caplog.at_level(logging.WARNING, logger="st_hardneg.losses.base"), \
            pytest.warns(UserWarning, match=r"1 of 6 rows have an anchor or positive embedding of norm below 1e-06"):
        first = call(loss, cols)
    assert "1 of 6 rows have an anchor or positive embedding" in caplog.text
    assert math.isfinite(first.item())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        second = call(loss, cols)  # once per loss instance
    assert math.isfinite(second.item())
    with pytest.warns(UserWarning, match="1 of 6 rows"):
        call(FACTORIES[name](), cols)  # a new loss warns again


@pytest.mark.parametrize("name", ALL)
def test_zero_norm_rows_have_a_finite_gradient_and_none_of_their_own(name):
    """A left-out anchor row gets no gradient from its own (unused) loss term; every gradient is finite."""
    anchors, positives = pairs()
    anchors[2] = 0.0
    leaves = [anchors.clone().requires_grad_(True), positives.clone().requires_grad_(True)]
    with pytest.warns(UserWarning, match="1 of 6 rows"):
        value = FACTORIES[name]().compute_loss_from_embeddings(leaves, None)
    value.backward()
    assert torch.isfinite(leaves[0].grad).all() and torch.isfinite(leaves[1].grad).all()
    if name in ("focal", "adcse_mnrl"):
        # anchors are not candidates in query_to_doc: the zero anchor's only term is its own row, left out
        assert float(leaves[0].grad[2].abs().max()) == 0.0


# =============================================================================== rows without a negative
@pytest.mark.parametrize("name", RANKED)
def test_identical_rows_are_an_error_naming_the_cause(name):
    """Identical rows (one text repeated, or a collapsed model): every candidate duplicates the positive and is
    masked, so no row has a negative: the batch is refused with the counts and the cause."""
    row = pairs()[0][:1]
    cols = [row.repeat(N, 1), row.repeat(N, 1)]
    loss = FACTORIES[name]()
    with pytest.raises(ValueError, match=NO_NEGATIVE.format(k=6) + r" \(every candidate was masked as a false "
                                         r"negative, or the batch repeats one text"):
        call(loss, cols)
    assert loss.diagnostics["rows_without_negatives"] == 6.0 and loss.diagnostics["masked_fraction"] == 1.0
    assert loss.diagnostics["unusable_fraction"] == 1.0


def test_identical_rows_without_the_duplicate_mask_are_sentence_transformers_value():
    """mask_duplicates=False asks for sentence-transformers' behaviour: N identical candidates, loss log N."""
    row = pairs()[0][:1]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        value = call(FACTORIES["adcse_mnrl"](mask_duplicates=False), [row.repeat(N, 1), row.repeat(N, 1)])
    assert value.item() == pytest.approx(math.log(N), rel=1e-6)


def test_identical_rows_keep_adcse_adversaries_as_negatives():
    """AdCSE's adversaries are never masked: identical rows still have M negatives, but adversaries alone do not make
    a row usable, so the batch is refused as in every loss; in the paper's Eq. 5 (``in_batch_keys=False``: the
    adversaries are the only negatives) the loss is the exact cross-entropy over the positive (cosine 1) and the
    adversaries."""
    row = pairs()[0][:1]
    with pytest.raises(ValueError, match=NO_NEGATIVE.format(k=N)):
        call(FACTORIES["adcse"](), [row.repeat(N, 1), row.repeat(N, 1)])
    loss = FACTORIES["adcse"](in_batch_keys=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        value = call(loss, [row.repeat(N, 1), row.repeat(N, 1)]).item()
    unit = F.normalize(row.double(), dim=1)
    adversaries = F.normalize(loss.adversaries.detach().double(), dim=1)
    logits = torch.cat([torch.ones(1, dtype=torch.float64), (unit @ adversaries.T).flatten()]) / TAU
    assert value == pytest.approx(float(torch.logsumexp(logits, 0) - logits[0]), rel=1e-5)


@pytest.mark.parametrize("name", RANKED)
def test_one_text_repeated_across_the_batch_is_an_error(name):
    """The texts decide duplicates when the loss sees token ids: one positive text for every pair masks every
    candidate even though the embeddings differ (dropout)."""
    cols = pairs()
    loss = FACTORIES[name]()
    loss.set_false_negative_inputs(text_keys=torch.tensor([list(range(N)), [7] * N]))
    with pytest.raises(ValueError, match=NO_NEGATIVE.format(k=6)):
        call(loss, cols)
    assert loss.diagnostics["rows_without_negatives"] == 6.0


@pytest.mark.parametrize("name", RANKED)
@pytest.mark.parametrize(("margin", "strategy"), [(2.5, "absolute"), (3.0, "relative")])
def test_a_margin_that_masks_everything_is_an_error(name, margin, strategy):
    """A false-negative margin larger than any cosine gap masks every candidate of every row."""
    loss = FACTORIES[name](margin=margin, margin_strategy=strategy)
    with pytest.raises(ValueError, match=NO_NEGATIVE.format(k=6) + " .*check margin"):
        call(loss, pairs())
    assert loss.diagnostics["masked_fraction"] == 1.0 and loss.diagnostics["rows_without_negatives"] == 6.0


@pytest.mark.parametrize(("name", "focal_m"), [("focal", 0.3), ("adcse_mnrl", None)])
def test_a_row_masked_by_the_margin_is_left_out_and_the_others_are_exact(name, focal_m):
    """margin=0: a candidate closer to the anchor than its positive is masked. Row 0's positive is the opposite of
    its anchor, so all of row 0's candidates are masked (warned); the other rows are computed by hand with the same
    rule, and the batch loss is the mean over the 5 usable rows."""
    anchors, positives = pairs(noise=0.1)
    positives[0] = -anchors[0]
    loss = FACTORIES[name](margin=0.0, temperature=0.2)  # losses of order 1
    with pytest.warns(UserWarning, match=r"1 of 6 rows of a batch have no negative left"):
        value = call(loss, [anchors, positives]).item()
    a, p = F.normalize(anchors, dim=1), F.normalize(positives, dim=1)
    cos = a @ p.T
    exclude = cos > cos.diagonal().unsqueeze(1)
    exclude.fill_diagonal_(False)
    assert bool(exclude[0, 1:].all()) and bool(((~exclude[1:]).sum(dim=1) >= 2).all())  # only row 0 fully masked
    rows = infonce_rows(anchors, positives, exclude=exclude, focal_m=focal_m, tau=0.2)
    assert rows[0] == 0.0
    assert value == pytest.approx(sum(rows) / (N - 1), rel=1e-5)
    assert value != pytest.approx(sum(rows) / N, rel=1e-3)  # counting the empty row would differ
    assert loss.diagnostics["rows_without_negatives"] == 1.0
    assert loss.diagnostics["unusable_fraction"] == pytest.approx(1 / N)
    assert loss.diagnostics["masked_fraction"] == pytest.approx(float(exclude.sum()) / (N * (N - 1)), rel=1e-6)


@pytest.mark.parametrize("name", ALL)
def test_a_healthy_batch_is_silent_and_reports_no_unusable_rows(name):
    loss = FACTORIES[name]()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        value = call(loss, pairs())
    assert math.isfinite(value.item()) and value.item() > 0
    assert not {"zero_norm_rows", "unusable_fraction", "rows_without_negatives"} & set(loss.diagnostics)


# =============================================================================== through forward: GradCache, gather
@pytest.fixture
def repeated_features(tiny_model):
    """One sentence repeated 8 times, tokenised by the model (forward's text keys see the repetition)."""
    return [tiny_model.preprocess(["the cat eats food."] * 8) for _ in range(2)]


@pytest.mark.parametrize("cls", [MixCSELoss, FocalInfoNCELoss, HNCSELoss])
@pytest.mark.parametrize("options", [{}, {"mini_batch_size": 3}, {"gather_across_devices": True},
                                     {"mini_batch_size": 2, "gather_across_devices": True}],
                         ids=["plain", "gradcache", "gather", "gradcache+gather"])
def test_one_text_repeated_through_forward_is_an_error_on_every_path(tiny_model, repeated_features, cls, options):
    """The same error with GradCache (mini-batches) and gather_across_devices (no process group: the local batch),
    before any gradient reaches the model."""
    tiny_model.zero_grad()
    loss = cls(tiny_model, **options)
    with pytest.raises(ValueError, match=NO_NEGATIVE.format(k=8)):
        loss(repeated_features, None)
    assert loss.diagnostics["rows_without_negatives"] == 8.0
    assert all(p.grad is None or float(p.grad.abs().max()) == 0.0 for p in tiny_model.parameters())


def test_gradcache_and_plain_agree_on_a_batch_with_a_zero_row(tiny_model, tiny_sentences):
    """A model whose output is zero for one sentence (a hook zeroes row 3): the cached loss equals the uncached one,
    both leave the row out with the same warning."""
    tiny_model.eval()
    features = [tiny_model.preprocess(tiny_sentences[:8]) for _ in range(2)]

    def zero_row(module, args, output):
        if output["sentence_embedding"].size(0) == 8:  # the full batch (uncached)
            output["sentence_embedding"] = output["sentence_embedding"].clone()
            output["sentence_embedding"][3] = 0.0
        elif output["sentence_embedding"].size(0) == 4 and zero_row.calls % 2 == 0:  # mini-batch holding row 3
            output["sentence_embedding"] = output["sentence_embedding"].clone()
            output["sentence_embedding"][3] = 0.0
        zero_row.calls += 1
        return output

    zero_row.calls = 0
    handle = tiny_model.register_forward_hook(zero_row)
    try:
        with pytest.warns(UserWarning, match=r"1 of 8 rows have an anchor or positive embedding of norm below"):
            plain = FocalInfoNCELoss(tiny_model, mask_duplicates=False)(features, None)
        zero_row.calls = 0
        with pytest.warns(UserWarning, match=r"1 of 8 rows have an anchor or positive embedding of norm below"):
            cached = FocalInfoNCELoss(tiny_model, mask_duplicates=False, mini_batch_size=4)(features, None)
    finally:
        handle.remove()
    assert cached.item() == pytest.approx(plain.item(), rel=1e-5)


# =============================================================================== the margin m blamed, not τ
@pytest.mark.parametrize(("factory", "name"), [
    (lambda: MixCSELoss(None, focal_m=1e30), r"focal_m \(the Focal-InfoNCE margin m\)=1e\+30"),
    (lambda: HNCSELoss(None, focal_m=1e30), r"focal_m \(the Focal-InfoNCE margin m\)=1e\+30"),
    (lambda: MixCSELoss(None, focal_m=6e29, temperature=0.5), r"focal_m \(the Focal-InfoNCE margin m\)=6e\+29"),
    (lambda: FocalInfoNCELoss(None, m=1e5, temperature=1e-26), r"m \(the Focal-InfoNCE margin\)=100000\.0"),
])
def test_an_overflowing_focal_margin_blames_the_margin(factory, name):
    with pytest.raises(ValueError, match=rf"^{name} is too large for temperature=.*: the negative logits s \(s \+ m\) / "
                                         r"temperature reach \(1 \+ m\) / temperature"):
        factory()


def test_focal_m_beyond_its_range_is_named():
    with pytest.raises(ValueError, match=r"^m \(the Focal-InfoNCE margin\) must be a finite number in \[0, 1e\+06\], "
                                         r"got 1e\+30"):
        FocalInfoNCELoss(None, m=1e30)


def test_a_large_but_safe_focal_margin_is_accepted():
    """(1 + m) / τ = 1e6 / 0.05 = 2e7 is far from overflowing: m = 1e6 is accepted as given."""
    assert FocalInfoNCELoss(None, m=1e6).m == 1e6
    assert MixCSELoss(None, focal_m=1e6).focal_m == 1e6
