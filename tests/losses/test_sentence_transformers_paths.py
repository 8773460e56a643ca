"""The paths sentence-transformers' own losses take, with an st-hardneg loss in their place: a cached loss inside
``MatryoshkaLoss`` (one ``calculate_loss`` per dimension, all inside one forward), a batch of one pair (the last
batch of an epoch), the key encoder in evaluation, and options assigned on a built loss."""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch
from sentence_transformers import util
from sentence_transformers.sentence_transformer.losses import MatryoshkaLoss, MultipleNegativesRankingLoss

from st_hardneg import AdversarialNegativesLoss, FocalInfoNCELoss, HNCSELoss, MixCSELoss
from st_hardneg.models import load_model
from st_hardneg.testing import make_tiny_model_dir

ANCHORS = ["the cat sat on the mat.", "a man plays a guitar.", "the sky is blue today.", "children read a book.",
           "a car drives on the road.", "people walk to the station."]
#: positive 3 repeats positive 0's text (a duplicate the text mask removes); the mapping marks positive 2 relevant to
#: anchor 1
POSITIVES = ["a cat is on the mat.", "the man is playing guitar.", "today the sky is blue.", "a cat is on the mat.",
             "a car on the road.", "people go to the station."]
KNOWN = {ANCHORS[1]: [POSITIVES[2]]}

LOSSES = {
    "mixcse": lambda model, guide, **kw: MixCSELoss(model, guide, **kw),
    "focal": lambda model, guide, **kw: FocalInfoNCELoss(model, guide, **kw),
    "hncse": lambda model, guide, **kw: HNCSELoss(model, guide, mode="both", k=2, num_mixed=2, **kw),
    "adcse": lambda model, guide, **kw: AdversarialNegativesLoss(model, guide, num_adversaries=4, **kw),
}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("st-paths")
    model = load_model(make_tiny_model_dir(root / "model", seed=0), pooling="mean", max_seq_length=16, device="cpu")
    guide = load_model(make_tiny_model_dir(root / "guide", seed=1), pooling="mean", max_seq_length=16, device="cpu")
    model.eval()  # no dropout: the cached and the uncached forward embed the same vectors
    guide.eval()
    return model, guide


def _matryoshka_loss_and_grads(model, guide, name, mini_batch_size):
    loss = LOSSES[name](model, guide, known_positives=KNOWN, mini_batch_size=mini_batch_size, seed=0)
    wrapped = MatryoshkaLoss(model, loss, [32, 16], matryoshka_weights=[1.0, 0.5])
    model.zero_grad()
    value = wrapped([model.preprocess(ANCHORS), model.preprocess(POSITIVES)], None)
    value.backward()
    grads = [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad()
    return value.detach(), grads, loss


@pytest.mark.parametrize("name", list(LOSSES))
def test_a_cached_loss_inside_matryoshka_computes_every_dimension_with_its_batchs_masks(models, name):
    """MatryoshkaLoss calls a cached loss's ``calculate_loss`` once per dimension inside one forward; every one of
    them computes with the batch's guide embeddings, known positives and text keys (before, the second dimension
    raised: the guide's embeddings were forgotten after the first). Cached equals uncached, loss and gradients."""
    model, guide = models
    plain, plain_grads, _ = _matryoshka_loss_and_grads(model, guide, name, None)
    cached, cached_grads, loss = _matryoshka_loss_and_grads(model, guide, name, 2)
    torch.testing.assert_close(cached, plain, rtol=1e-6, atol=1e-6)
    assert len(cached_grads) == len(plain_grads) > 0
    scale = max(float(g.abs().max()) for g in plain_grads)
    for got, want in zip(cached_grads, plain_grads, strict=True):
        torch.testing.assert_close(got / scale, want / scale, rtol=1e-6, atol=1e-6)
    # the masks were applied in the last dimension too: the duplicate and the mapped candidate are masked
    assert loss.diagnostics["masked_known_positives_total"] >= 1
    assert loss.diagnostics["masked_false_negatives_total"] >= 2


def test_without_the_masks_the_matryoshka_value_differs(models):
    """The comparison above can fail: the same batch without the guide, the mapping and the duplicate mask gives
    another value."""
    model, guide = models
    masked, _, _ = _matryoshka_loss_and_grads(model, guide, "focal", 2)
    loss = FocalInfoNCELoss(model, mask_duplicates=False, mini_batch_size=2)
    with torch.no_grad():
        bare = MatryoshkaLoss(model, loss, [32, 16], matryoshka_weights=[1.0, 0.5])(
            [model.preprocess(ANCHORS), model.preprocess(POSITIVES)], None)
    assert abs(float(bare) - float(masked)) > 1e-3


@pytest.mark.parametrize("name", list(LOSSES))
def test_every_layer_of_adaptive_layer_loss_computes_with_the_batchs_masks(models, name):
    """AdaptiveLayerLoss calls the loss once per layer (each a forward of its own): every call masks the mapped
    candidate and the duplicate. (A cached loss inside AdaptiveLayerLoss is sentence-transformers' own unsupported
    combination: it warns, and its CachedMultipleNegativesRankingLoss fails there the same way.)"""
    from sentence_transformers.sentence_transformer.losses import AdaptiveLayerLoss

    model, guide = models
    loss = LOSSES[name](model, guide, known_positives=KNOWN, seed=0)
    seen: list[tuple[float, float]] = []
    loss.register_forward_hook(lambda module, args, output: seen.append(
        (module.diagnostics["masked_known_positives_total"], module.diagnostics["masked_false_negatives_total"])))
    with torch.no_grad():
        AdaptiveLayerLoss(model, loss, n_layers_per_step=-1)([model.preprocess(ANCHORS), model.preprocess(POSITIVES)],
                                                             None)
    layers = model[0].auto_model.config.num_hidden_layers + 1  # the embedding layer's output too
    assert len(seen) == layers  # the last layer, then every earlier one
    assert all(known >= 1 and total >= 2 for known, total in seen)


# ------------------------------------------------------------------------------------------ a batch of one pair
def _one_pair(columns: int = 2, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, 8, generator=g) for _ in range(columns)]


def _loss_and_grads(loss, columns):
    leaves = [c.clone().requires_grad_(True) for c in columns]
    value = loss.compute_loss_from_embeddings(leaves, None)
    value.backward()
    return value.detach(), [leaf.grad for leaf in leaves]


@pytest.mark.parametrize("columns", [2, 3])
def test_the_mnrl_reduction_computes_one_pair_as_mnrl(models, columns):
    """AdCSE without adversaries and with tied keys, on one pair (with and without an explicit negative): MNRL's
    value and gradients (MNRL: the positive alone, or with the negative, as candidate)."""
    model = models[0]
    g = torch.Generator().manual_seed(0)
    cols = [torch.randn(1, model.get_embedding_dimension(), generator=g) for _ in range(columns)]
    ours = AdversarialNegativesLoss(model, num_adversaries=0, untied=False, mask_duplicates=False)
    theirs = MultipleNegativesRankingLoss.__new__(MultipleNegativesRankingLoss)
    torch.nn.Module.__init__(theirs)
    theirs.scale, theirs.similarity_fct, theirs.gather_across_devices = 20.0, util.cos_sim, False
    theirs.directions, theirs.partition_mode, theirs.hardness_mode, theirs.hardness_strength = (
        ("query_to_doc",), "joint", None, 0.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning: the batch is computed, not skipped
        value, grads = _loss_and_grads(ours, cols)
    want, want_grads = _loss_and_grads(theirs, cols)
    torch.testing.assert_close(value, want, rtol=1e-6, atol=1e-6)
    for got, expected in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
    if columns == 3:  # a real value, not the lone positive's 0
        assert float(value) > 1e-3


def test_focal_computes_one_pair_by_its_equation():
    """Focal-InfoNCE on one pair with an explicit negative: ``-log e^{s_p²/τ} / (e^{s_p²/τ} + e^{s_n(s_n+m)/τ})``;
    without a negative, 0 (the positive alone, as MNRL)."""
    a, p, n = (torch.nn.functional.normalize(c, dim=-1) for c in _one_pair(3, seed=1))
    sp, sn = float(a @ p.T), float(a @ n.T)
    tau, m = 0.05, 0.3
    want = -torch.log_softmax(torch.tensor([sp * sp / tau, sn * (sn + m) / tau]), 0)[0]
    loss = FocalInfoNCELoss(None, m=m)
    assert float(loss.compute_loss_from_embeddings(_one_pair(3, seed=1), None)) == pytest.approx(float(want),
                                                                                                 rel=1e-6)
    assert float(loss.compute_loss_from_embeddings(_one_pair(2, seed=1), None)) == 0.0


def test_adcse_computes_one_pair_against_its_adversaries(models):
    """AdCSE on one pair: the positive against the adversaries (paper Eq. 5's row), not a refusal."""
    model, _ = models
    loss = AdversarialNegativesLoss(model, num_adversaries=3, seed=0, mask_duplicates=False)
    g = torch.Generator().manual_seed(2)
    a, p = (torch.randn(1, loss.embedding_dim, generator=g) for _ in range(2))
    au, pu = torch.nn.functional.normalize(a, dim=-1), torch.nn.functional.normalize(p, dim=-1)
    adversaries = torch.nn.functional.normalize(loss.adversaries, dim=-1)
    logits = torch.cat([au @ pu.T, au @ adversaries.T], dim=1).flatten() / 0.05
    want = -torch.log_softmax(logits, 0)[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = loss.compute_loss_from_embeddings([a, p], None)
    assert float(got) == pytest.approx(float(want), rel=1e-6)


@pytest.mark.parametrize("factory", [lambda: MixCSELoss(None), lambda: HNCSELoss(None, mode="both", k=2)],
                         ids=["mixcse", "hncse"])
def test_a_paper_that_needs_another_row_skips_one_pair_with_one_warning(factory):
    """MixCSE mixes with another pair's positive and HNCSE mines other pairs: a one-pair batch is skipped (loss 0,
    a zero gradient for every embedding) with one warning per loss, never an exception."""
    loss = factory()
    leaves = [c.clone().requires_grad_(True) for c in _one_pair(2)]
    with pytest.warns(UserWarning, match=r"a batch of 1 pair\(s\) is smaller than the \d its equation needs.*"
                                         r"dataloader_drop_last=True"):
        value = loss.compute_loss_from_embeddings(leaves, None)
    assert float(value) == 0.0
    value.backward()
    assert all(leaf.grad is not None and float(leaf.grad.abs().sum()) == 0.0 for leaf in leaves)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per loss
        assert float(loss.compute_loss_from_embeddings(_one_pair(2, seed=3), None)) == 0.0
    # a batch the equation computes is computed as before
    assert float(loss.compute_loss_from_embeddings([torch.randn(4, 8), torch.randn(4, 8)], None)) > 0


def test_a_skipped_batch_under_gradcache_gives_zero_gradients(models):
    """The skip composes with GradCache's step (2): the cached gradients are zeros, the backward goes through."""
    model, _ = models
    loss = MixCSELoss(model, mini_batch_size=1)
    model.zero_grad()
    with pytest.warns(UserWarning, match="smaller than the 2 its equation needs"):
        value = loss([model.preprocess(ANCHORS[:1]), model.preprocess(POSITIVES[:1])], None)
    value.backward()
    assert float(value) == 0.0
    assert all(p.grad is None or float(p.grad.abs().sum()) == 0.0 for p in model.parameters())


# ------------------------------------------------------------------------------------------ AdCSE's key encoder
def test_adcse_key_encoder_follows_the_models_train_and_eval_mode(models):
    """In evaluation the key encoder's dropout is off, as the online model's: two calls on one batch give one value.
    In training it is on (the paper's noise between a query and its key): two calls differ."""
    model, _ = models
    loss = AdversarialNegativesLoss(model, num_adversaries=2, seed=0)
    for module in loss.key_encoder.modules():  # a visible dropout in the key encoder only
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.3
    features = [model.preprocess(ANCHORS), model.preprocess(POSITIVES[:3] + ANCHORS[3:])]
    model.eval()
    with torch.no_grad():
        first, second = (float(loss(features, None)) for _ in range(2))
    assert first == second and not loss.key_encoder.training
    model.train()
    try:
        for module in model.modules():  # the online model without dropout: only the key encoder's is drawn
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.0
        with torch.no_grad():
            third, fourth = (float(loss(features, None)) for _ in range(2))
        assert third != fourth and loss.key_encoder.training
    finally:
        model.eval()
        for module in model.modules():
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.1


# ------------------------------------------------------------------------------------------ options assigned
def _cols(n: int = 6, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, 8, generator=g) for _ in range(2)]


OPTION_LOSSES = {
    "mixcse": lambda model, **kw: MixCSELoss(None, seed=0, reverse_mix=False, **kw),
    "focal": lambda model, **kw: FocalInfoNCELoss(None, **kw),
    "hncse": lambda model, **kw: HNCSELoss(None, mode="both", k=2, seed=0, **kw),
    "adcse": lambda model, **kw: AdversarialNegativesLoss(model, num_adversaries=0, untied=False, **kw),
}


@pytest.mark.parametrize("loss_name", list(OPTION_LOSSES))
@pytest.mark.parametrize(("name", "value", "built"), [
    ("scale", 5.0, {"scale": 5.0}), ("temperature", 0.1, {"temperature": 0.1}),
    ("margin", 0.05, {"margin": 0.05}), ("mask_duplicates", False, {"mask_duplicates": False}),
    ("directions", ("query_to_doc", "doc_to_query"), {"directions": ("query_to_doc", "doc_to_query")}),
    ("hardness_mode", "in_batch_negatives", {"hardness_mode": "in_batch_negatives", "hardness_strength": 0.0}),
])
def test_an_assigned_option_is_the_loss_built_with_it(models, loss_name, name, value, built):
    """``loss.<option> = value`` (as sentence-transformers keeps its losses' options assignable) computes the next
    batch exactly as a loss built with that option; ``loss.options`` and ``get_config_dict`` report it."""
    model = models[0]
    factory = OPTION_LOSSES[loss_name]
    width = 8 if loss_name != "adcse" else model.get_embedding_dimension()
    g = torch.Generator().manual_seed(0)
    cols = [torch.randn(6, width, generator=g) for _ in range(2)]
    loss = factory(model)
    before = float(loss.compute_loss_from_embeddings(cols, None))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a hardness mode with strength 0 warns, built or assigned
        setattr(loss, name, value)
        fresh = factory(model, **built)
    assert getattr(loss, name) == (pytest.approx(value) if isinstance(value, float) else value)
    assert loss.options == fresh.options and loss.get_config_dict() == fresh.get_config_dict()
    want = float(fresh.compute_loss_from_embeddings(cols, None))
    assert float(loss.compute_loss_from_embeddings(cols, None)) == pytest.approx(want, rel=1e-6)
    if name in ("scale", "temperature", "directions"):
        assert want != pytest.approx(before, rel=1e-4)  # the option changes the number


def test_replacing_the_options_whole_is_applied():
    """``loss.options = dataclasses.replace(loss.options, temperature=0.1)``: used by the next batch, not only
    reported."""
    cols = _cols(seed=1)
    loss = FocalInfoNCELoss(None)
    loss.options = dataclasses.replace(loss.options, temperature=0.1)
    assert loss.temperature == 0.1 and loss.get_config_dict()["scale"] == pytest.approx(10.0)
    want = float(FocalInfoNCELoss(None, temperature=0.1).compute_loss_from_embeddings(cols, None))
    assert float(loss.compute_loss_from_embeddings(cols, None)) == pytest.approx(want, rel=1e-6)
    assert want != pytest.approx(float(FocalInfoNCELoss(None).compute_loss_from_embeddings(cols, None)), rel=1e-4)


def test_an_assigned_option_is_checked_as_the_constructor_checks_it():
    loss = FocalInfoNCELoss(None)
    for name, value, message in (("scale", -1.0, "scale"), ("temperature", 0.0, "temperature"),
                                 ("margin", -1, "margin must be a finite number >= 0, got -1"),
                                 ("similarity_fct", util.dot_score, "needs similarity_fct=cos_sim"),
                                 ("partition_mode", "per_direction_x", "partition_mode")):
        with pytest.raises(ValueError, match=message) as caught:
            setattr(loss, name, value)
        assert "\n" not in str(caught.value)
        with pytest.raises(ValueError) as built:
            FocalInfoNCELoss(None, **{name: value})
        assert str(built.value).split(":")[-1] == str(caught.value).split(":")[-1]
    assert loss.options == FocalInfoNCELoss(None).options  # nothing half-applied
    with pytest.raises(ValueError, match=r"m \(the Focal-InfoNCE margin\)"):
        FocalInfoNCELoss(None, m=1e6).temperature = 1e-25  # the paper's rule between m and τ, as when built


def test_known_positives_rebound_is_applied(models):
    """``loss.known_positives = mapping`` masks what the new mapping marks, from the next batch on (built with
    it: the same value); ``None`` turns it off."""
    model, _ = models
    features = [model.preprocess(ANCHORS), model.preprocess(["x " + t for t in POSITIVES])]
    loss = FocalInfoNCELoss(model)
    with torch.no_grad():
        plain = float(loss(features, None))
        loss.known_positives = {ANCHORS[1]: ["x " + POSITIVES[2]]}
        got = float(loss(features, None))
        want = float(FocalInfoNCELoss(model, known_positives={ANCHORS[1]: ["x " + POSITIVES[2]]})(features, None))
        assert got == pytest.approx(want, rel=1e-6) and got != pytest.approx(plain, rel=1e-6)
        assert loss.diagnostics["masked_known_positives_total"] == 1
        loss.known_positives = None
        assert float(loss(features, None)) == pytest.approx(plain, rel=1e-6)


@pytest.mark.parametrize(("name", "value", "message"), [
    ("queue_size", 16, r"queue_size is fixed when the loss is built .*build a new loss with queue_size=\.\.\."),
    ("guide", object(), r"guide is fixed when the loss is built .*build a new loss with guide=\.\.\."),
])
def test_what_cannot_be_applied_is_refused_with_what_to_do(name, value, message):
    loss = FocalInfoNCELoss(None)
    with pytest.raises(AttributeError, match=message) as caught:
        setattr(loss, name, value)
    assert "\n" not in str(caught.value)
    with pytest.raises(AttributeError, match="queue's options are fixed"):
        loss.options = dataclasses.replace(loss.options, queue=16)
    with pytest.raises(TypeError, match="must be a SharedOptions"):
        loss.options = {"temperature": 0.1}
