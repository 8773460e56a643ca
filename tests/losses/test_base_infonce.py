"""The base class is a loss of its own: InfoNCE over sentence-transformers' blocks, i.e. ST's
``MultipleNegativesRankingLoss`` (and its Cached form) with the shared features, to 1e-6."""

from __future__ import annotations

import pytest
import torch
from sentence_transformers import util
from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

from st_hardneg import AdversarialNegativesLoss
from st_hardneg.losses.base import HardNegativeLoss


def _mnrl(model, **options):
    return MultipleNegativesRankingLoss(model, **options)


def _loss_and_grads(loss, cols):
    leaves = [c.clone().requires_grad_(True) for c in cols]
    value = loss.compute_loss_from_embeddings(leaves, None)
    value.backward()
    return value.detach(), [leaf.grad for leaf in leaves]


@pytest.mark.parametrize(("options", "columns"), [
    ({}, 2), ({}, 3), ({"scale": 50.0, "similarity_fct": util.dot_score}, 3),
    ({"directions": ("query_to_doc", "doc_to_query"), "partition_mode": "per_direction"}, 2),
    ({"directions": ("query_to_doc", "query_to_query", "doc_to_query", "doc_to_doc")}, 3),
    ({"hardness_mode": "all_negatives", "hardness_strength": 5.0}, 3),
])
def test_the_base_and_the_adcse_reduction_equal_mnrl(tiny_model, options, columns):
    g = torch.Generator().manual_seed(0)
    dim = tiny_model.get_embedding_dimension()
    cols = [torch.randn(6, dim, generator=g) * torch.linspace(0.3, 1.2, 6).unsqueeze(1) for _ in range(columns)]
    want, want_grads = _loss_and_grads(_mnrl(tiny_model, **options), cols)
    for ours in (HardNegativeLoss(tiny_model, mask_duplicates=False, **options),
                 AdversarialNegativesLoss(tiny_model, num_adversaries=0, untied=False, mask_duplicates=False,
                                          **options)):
        value, grads = _loss_and_grads(ours, cols)
        # float32 resolves a logit L to about 1e-7·L: 1e-6 of the largest logit (as test_st_parity.py)
        scale = options.get("scale", 20.0)
        logit = scale if "similarity_fct" not in options else float(
            max(c.norm(dim=1).max() for c in cols) ** 2 * scale)
        atol = 1e-6 * max(1.0, logit + options.get("hardness_strength", 0.0))
        torch.testing.assert_close(value, want, rtol=1e-6, atol=atol)
        for got, expected in zip(grads, want_grads, strict=True):
            torch.testing.assert_close(got, expected, rtol=1e-6, atol=atol)


def test_the_base_caches_as_the_adcse_reduction(tiny_model, tiny_sentences):
    """With ``mini_batch_size`` the base is the cached AdCSE reduction (which test_st_parity.py pins to
    ``CachedMultipleNegativesRankingLoss``), loss and gradients, and so is the uncached base."""
    tiny_model.eval()
    features = [tiny_model.preprocess(tiny_sentences[:6]), tiny_model.preprocess(tiny_sentences[6:12])]

    def run(loss):
        tiny_model.zero_grad()
        value = loss(features, None)
        value.backward()
        grads = [p.grad.detach().clone() for p in tiny_model.parameters() if p.grad is not None]
        return value.detach(), grads

    for mini_batch_size in (2, None):
        want, want_grads = run(AdversarialNegativesLoss(tiny_model, num_adversaries=0, untied=False,
                                                        mask_duplicates=False, mini_batch_size=mini_batch_size))
        got, grads = run(HardNegativeLoss(tiny_model, mask_duplicates=False, mini_batch_size=mini_batch_size))
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
        for a, b in zip(grads, want_grads, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-9)


def test_the_base_reports_its_options_and_no_paper():
    loss = HardNegativeLoss(None, temperature=0.1, margin=0.05)
    config = loss.get_config_dict()
    assert config["scale"] == pytest.approx(10.0) and config["margin"] == 0.05 and "lam" not in config
