"""Bad inputs across the losses: each case asserts a clear error or the exact correct result, never a silent NaN.

The checks live in the batch preparer every loss owns (``BatchPreparer.prepare``), so they are run for every loss, including
AdversarialNegativesLoss for the input checks (NaN, embedding sizes, labels).
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from st_hardneg import AdversarialNegativesLoss, FocalInfoNCELoss, HNCSELoss, MixCSELoss
from st_hardneg.functional import NORM_EPS
from st_hardneg.testing import two_way

TAU = 0.05

#: name -> (factory(model), the largest |d logit / d cos| · τ of its logits: 1 plain, 2 + m focal)
LOSSES = {
    "mixcse": (lambda model: MixCSELoss(model), 1.0),
    "mixcse_official": (lambda model: MixCSELoss(model, layout="official"), 1.0),
    "mixcse_nosg_focal": (lambda model: MixCSELoss(model, stop_gradient=False, focal_m=0.3), 2.3),
    "focal": (lambda model: FocalInfoNCELoss(model, **two_way(True)), 2.3),
    "hncse_pm": (lambda model: HNCSELoss(model, mode="pm", pm_threshold=10.0), 1.0),
    "hncse_both": (lambda model: HNCSELoss(model, mode="both", k=3, num_mixed=4, seed=0), 1.0),
}
NAMES = list(LOSSES)


class SizedModel(torch.nn.Module):
    """A stand-in for a SentenceTransformer that reports its embedding size."""

    def __init__(self, dim: int | None) -> None:
        super().__init__()
        self.dim = dim

    def get_embedding_dimension(self) -> int | None:
        return self.dim


def make(name, model=None):
    return LOSSES[name][0](model)


def columns(n=6, d=8, k=1, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, d, generator=g)
    return [h, h + 0.3 * torch.randn(n, d, generator=g), *(torch.randn(n, d, generator=g) for _ in range(k))]


# ---------------------------------------------------------------------------------------------- non-finite values
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize(("column", "value", "label"), [
    (0, float("nan"), "anchor"), (1, float("inf"), "positive"), (2, float("-inf"), "negative_1"),
])
def test_non_finite_embeddings_raise_naming_the_column(name, column, value, label):
    cols = columns()
    cols[column][2, 3] = value
    with pytest.raises(ValueError, match=rf"the {label} embeddings \(column {column}\) contain NaN or inf"):
        make(name).compute_loss_from_embeddings(cols, None)


@pytest.mark.parametrize("name", NAMES)
def test_norm_beyond_float32_raises(name):
    """Entries of 3e38 are finite but the row's norm (3e38 · sqrt(8)) is not representable in float32."""
    cols = columns()
    cols[1][4] = 3e38
    with pytest.raises(ValueError, match=r"norm of the positive embeddings .* exceeds float32"):
        make(name).compute_loss_from_embeddings(cols, None)


@pytest.mark.parametrize("name", NAMES)
def test_large_finite_vectors_give_the_exact_loss(name):
    """Rows scaled by about 1e20 (their squares overflow float32) give the loss of the unscaled rows: the losses are
    invariant to the scale of each row (MixCSE official, which mixes raw vectors, to a common scale only) and the norm
    is computed without squaring overflow."""
    cols = columns()
    reference = make(name).compute_loss_from_embeddings(cols, None).item()
    per_row = torch.ones(6, 1) if name == "mixcse_official" else torch.linspace(1.0, 3.0, 6).unsqueeze(1)
    scaled = [(c.double() * per_row.double() * 1e20).float() for c in cols]
    assert not torch.isfinite((scaled[0] * scaled[0]).sum(1)).any()  # the naive norm would overflow
    value = make(name).compute_loss_from_embeddings(scaled, None).item()
    assert math.isfinite(value) and value == pytest.approx(reference, rel=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_mixed_precision_input_is_computed_in_float32(name):
    """A float16 batch gives the float32 loss of the same (float16-representable) values."""
    cols = [c.half() for c in columns()]
    half = make(name).compute_loss_from_embeddings(cols, None)
    full = make(name).compute_loss_from_embeddings([c.float() for c in cols], None)
    assert half.dtype == torch.float32 and half.item() == pytest.approx(full.item(), abs=1e-6)


# ---------------------------------------------------------------------------------------------- zero / tiny rows
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("scale", [0.0, 1e-30])
def test_zero_and_tiny_rows_have_bounded_gradients(name, scale):
    """A zero or 1e-30 row is normalised once, by ``x / max(||x||, NORM_EPS)``, whose Jacobian is bounded by
    ``1 / NORM_EPS``. Every logit is ``f(c) / τ`` of cosines ``c`` of unit vectors with ``|f'| <= 2 + m``, its
    gradient in the loss (a mean of N cross-entropies) is at most ``1 / N`` and each of the N·K logits contains the
    row at most twice; a mixture re-normalises at most once more with weights <= 1. Hence
    ``||dL/dx|| <= 2 K (2 + m) / (τ · NORM_EPS) · 4`` (4 for the symmetric / re-normalised paths). Normalising twice,
    as earlier versions did, multiplies this by ``1 / NORM_EPS`` (gradients of 1e15-1e16)."""
    factory, slope = LOSSES[name]
    cols = columns()
    cols[0][2] = scale * cols[0][2]
    cols[1][5] = scale * cols[1][5]
    leaves = [c.clone().requires_grad_(True) for c in cols]
    value = factory(None).compute_loss_from_embeddings(leaves, None)
    value.backward()
    n = cols[0].size(0)
    k_cols = 3 * n + 4 + n  # the widest loss: official N×3N + negatives + HNM mixtures
    bound = 2 * k_cols * slope / (TAU * NORM_EPS) * 4
    assert math.isfinite(value.item())
    for leaf in leaves:
        assert torch.isfinite(leaf.grad).all()
        assert float(leaf.grad.norm(dim=1).max()) < bound
    assert bound < 1e12  # far below the 1e15 of a double normalisation


@pytest.mark.parametrize("name", NAMES)
def test_zero_row_is_orthogonal_to_everything(name):
    """A zero anchor has cosine 0 with every candidate: its row of the diagnostics' positive mean is 0. With every
    anchor zero nothing can be ranked: the batch is refused (the unusable-row rule), the diagnostics still say why."""
    cols = columns()
    cols[0] = torch.zeros_like(cols[0])
    loss = make(name)
    with pytest.raises(ValueError, match=r"no usable row in this batch: .*6 of 6 rows have an anchor or positive "
                                         r"embedding of norm below 1e-06"):
        loss.compute_loss_from_embeddings(cols, None)
    assert loss.diagnostics["zero_norm_rows"] == 6.0 and loss.diagnostics["unusable_fraction"] == 1.0


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("scale", [0.0, 1e-20])
def test_zero_norm_rows_are_left_out_of_the_mean_with_a_warning(name, scale):
    """Rows whose anchor (or positive) has norm < NORM_EPS count nowhere in the mean: the loss equals the mean of
    the other rows' losses computed with the same candidates (the row's per-row loss read from the same batch)."""
    cols = columns()
    cols[0][1] = scale * cols[0][1]
    cols[1][4] = scale * cols[1][4]
    loss = make(name)
    rows_seen = []
    original = loss.ranking.usable_sum
    loss.ranking.usable_sum = lambda rows, batch, usable=None: (rows_seen.append(rows.detach().clone())
                                                                or original(rows, batch, usable))
    with pytest.warns(UserWarning, match=r"2 of 6 rows have an anchor or positive embedding of norm below 1e-06"):
        value = loss.compute_loss_from_embeddings(cols, None)
    rows = rows_seen[-1]
    keep = torch.tensor([True, False, True, True, False, True])
    assert value.item() == pytest.approx(rows[keep].mean().item(), rel=1e-6)
    assert value.item() != pytest.approx(rows.mean().item(), rel=1e-4)
    assert loss.diagnostics["zero_norm_rows"] == 2.0 and loss.diagnostics["unusable_fraction"] == pytest.approx(1 / 3)


# ---------------------------------------------------------------------------------------------- shapes and sizes
@pytest.mark.parametrize("name", NAMES)
def test_columns_of_different_widths_raise(name):
    cols = columns()
    cols[2] = torch.randn(6, 5)
    with pytest.raises(ValueError, match=r"same embedding size.*column 2 \(negative_1\) has 5"):
        make(name).compute_loss_from_embeddings(cols, None)


@pytest.mark.parametrize("name", NAMES)
def test_model_output_size_changed_after_construction_raises(name):
    loss = make(name, SizedModel(8))
    assert math.isfinite(loss.compute_loss_from_embeddings(columns(d=8), None).item())
    with pytest.raises(ValueError, match="built for a model with 8-dimensional embeddings but received 12"):
        loss.compute_loss_from_embeddings(columns(d=12), None)


@pytest.mark.parametrize("name", NAMES)
def test_integer_columns_raise(name):
    cols = columns()
    cols[1] = cols[1].long()
    with pytest.raises(ValueError, match=r"column 1 \(positive\) must be a floating-point tensor"):
        make(name).compute_loss_from_embeddings(cols, None)


# ---------------------------------------------------------------------------------------------- labels
@pytest.mark.parametrize("name", NAMES)
def test_labels_warn_once_per_loss(name):
    loss = make(name)
    cols = columns(k=0)
    with pytest.warns(UserWarning, match="does not use labels"):
        loss.compute_loss_from_embeddings(cols, torch.tensor([0.1, 0.9, 0.3, 0.5, 1.0, 0.0]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loss.compute_loss_from_embeddings(cols, torch.ones(6))  # warned once per loss instance


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("labels", [None, torch.zeros(6, dtype=torch.long)], ids=["none", "zeros"])
def test_absent_labels_do_not_warn(name, labels):
    """What ST passes for a dataset without labels: None (Trainer) or zeros (InputExample's default in fit)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        make(name).compute_loss_from_embeddings(columns(k=0), labels)


# ---------------------------------------------------------------------------------------------- temperature, alpha
@pytest.mark.parametrize("factory", [
    lambda t: MixCSELoss(None, temperature=t), lambda t: FocalInfoNCELoss(None, temperature=t, m=0.0),
    lambda t: HNCSELoss(None, temperature=t),
], ids=["mixcse", "focal", "hncse"])
@pytest.mark.parametrize("temperature", [1e-39, 1e-31])
def test_temperatures_whose_logits_overflow_are_rejected(factory, temperature):
    with pytest.raises(ValueError, match="too small"):
        factory(temperature)


def test_focal_margin_counts_in_the_logit_range():
    """Focal logits reach (1 + m) / τ: τ = 1.5e-30 is fine with m = 0 and rejected with m = 1."""
    assert FocalInfoNCELoss(None, temperature=1.5e-30, m=0.0).temperature == 1.5e-30
    with pytest.raises(ValueError, match="too small"):
        FocalInfoNCELoss(None, temperature=1.5e-30, m=1.0)
    with pytest.raises(ValueError, match="too small"):
        MixCSELoss(None, temperature=1.5e-30, focal_m=1.0)


@pytest.mark.parametrize("bad", [lambda c: torch.full_like(c, 1.5), lambda c: torch.full_like(c, float("nan")),
                                 lambda c: -0.2, lambda c: c], ids=["above_1", "nan", "negative_float", "cosine"])
def test_alpha_callable_outside_unit_interval_raises(bad):
    h, hp = columns(k=0)
    hp = hp.clone()
    hp[1] = -hp[0]  # makes some cos(G_a, G_b) negative, so alpha = cosine leaves [0, 1]
    loss = HNCSELoss(None, mode="hnm", k=5, num_mixed=4, alpha=bad, seed=0)
    with pytest.raises(ValueError, match="alpha must return weights in \\[0, 1\\]"):
        loss.compute_loss_from_embeddings([h, hp], None)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"reverse_mix": "no", **two_way(True)}, "reverse_mix must be True or False"),
    ({"stop_gradient": None}, "stop_gradient"),
    ({"seed": -1}, "seed"),
    ({"seed": 1.5}, "seed"),
    ({"lam": float("nan")}, "lam"),
    ({"lam": True}, "lam"),
])
def test_mixcse_argument_types(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MixCSELoss(None, **kwargs)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"pm_gradient": "yes"}, "pm_gradient"), ({"pm_weight_gradient": 1.0}, "pm_weight_gradient"),
    ({"k": True}, "k must be an integer"), ({"seed": "0"}, "seed"),
])
def test_hncse_argument_types(kwargs, match):
    with pytest.raises(ValueError, match=match):
        HNCSELoss(None, **kwargs)


# ---------------------------------------------------------------------------------------------- AdCSE (base checks)
@pytest.fixture
def adcse(tiny_model):
    return AdversarialNegativesLoss(tiny_model, num_adversaries=4, seed=0)


def test_adcse_nan_raises(adcse, tiny_model):
    dim = tiny_model.get_embedding_dimension()
    cols = columns(d=dim, k=0)
    cols[0][0, 0] = float("nan")
    with pytest.raises(ValueError, match=r"anchor embeddings \(column 0\) contain NaN"):
        adcse.compute_loss_from_embeddings(cols, None)


def test_adcse_dimension_change_raises(adcse, tiny_model):
    dim = tiny_model.get_embedding_dimension()
    with pytest.raises(ValueError, match=f"built for a model with {dim}-dimensional"):
        adcse.compute_loss_from_embeddings(columns(d=dim + 4, k=0), None)


def test_adcse_labels_warn_once(adcse, tiny_model):
    cols = columns(d=tiny_model.get_embedding_dimension(), k=0)
    with pytest.warns(UserWarning, match="does not use labels"):
        adcse.compute_loss_from_embeddings(cols, torch.arange(6))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        adcse.compute_loss_from_embeddings(cols, torch.arange(6))
        adcse.compute_loss_from_embeddings(cols, None)


def test_trainer_without_label_column_does_not_warn(tiny_model, tiny_sentences, tmp_path):
    """End to end: the Trainer on an (anchor, positive) dataset passes no labels, so nothing is warned."""
    from datasets import Dataset
    from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments

    dataset = Dataset.from_dict({"anchor": tiny_sentences[:8], "positive": tiny_sentences[:8]})
    args = SentenceTransformerTrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=8,
                                                num_train_epochs=1, report_to=[], save_strategy="no", seed=0)
    loss = MixCSELoss(tiny_model)
    SentenceTransformerTrainer(model=tiny_model, args=args, train_dataset=dataset, loss=loss).train()
    assert loss.preparer.warned_labels is False
    scored = Dataset.from_dict({"anchor": tiny_sentences[:8], "positive": tiny_sentences[:8],
                                "score": [0.5] * 8})
    with pytest.warns(UserWarning, match="does not use labels"):
        SentenceTransformerTrainer(model=tiny_model, args=args, train_dataset=scored, loss=loss).train()


def test_matryoshka_truncation_is_not_a_size_change(tiny_model, tiny_sentences):
    """MatryoshkaLoss truncates the model's output during its call; that is not the model changing size. A model that
    did change size (a different recorded dimension) still raises."""
    from sentence_transformers.sentence_transformer.losses import MatryoshkaLoss

    dim = tiny_model.get_embedding_dimension()
    features = tiny_model.tokenize(tiny_sentences[:8])
    inner = MixCSELoss(tiny_model)
    value = MatryoshkaLoss(tiny_model, inner, [dim, dim // 2])([features, features], None)
    assert math.isfinite(value.item())
    inner.embedding_dimension = dim + 1
    with pytest.raises(ValueError, match="output size changed"):
        inner([features, features], None)


# ---------------------------------------------------------------------------------------------- the base-class contract
@pytest.mark.parametrize("name", NAMES)
def test_loss_is_the_reduction_of_per_row_losses(name):
    """compute_loss_from_embeddings = the reduction of the per-row losses: a ranking part that sums instead of
    averaging gets N times
    the mean (what gathering across devices and GradCache rely on), for every loss and layout."""
    cols = columns()
    mean = make(name).compute_loss_from_embeddings(cols, None)
    rows = []
    summing = make(name)  # a fresh loss: the same seed gives the same random draws (HNM pairs)
    usable_sum = summing.ranking.usable_sum
    summing.ranking.usable_sum = lambda r, batch, usable=None: rows.append(r) or usable_sum(r, batch, usable)
    summing.ranking.mean = lambda total, count, state, every=None: (total, 1.0)  # the sum instead of the mean
    total = summing.compute_loss_from_embeddings(cols, None)
    assert rows[0].shape == (6,)
    assert total.item() == pytest.approx(6 * mean.item(), rel=1e-5)
