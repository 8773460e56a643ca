"""Validate at the door: a loss built on something that is not a model, and embeddings that are not
tensors, fail at once with a message that names the argument."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from st_hardneg import AdversarialNegativesLoss, FocalInfoNCELoss, HNCSELoss, MixCSELoss

CLASSES = [MixCSELoss, FocalInfoNCELoss, HNCSELoss, AdversarialNegativesLoss]


@pytest.mark.parametrize("cls", CLASSES)
@pytest.mark.parametrize("model", ["bert-base-uncased", 3, {"model": 1}])
def test_a_loss_built_on_a_non_model_names_the_model(cls, model):
    with pytest.raises(TypeError, match=r"model must be a SentenceTransformer .* got "):
        cls(model)


@pytest.mark.parametrize("cls", [MixCSELoss, FocalInfoNCELoss, HNCSELoss])
def test_numpy_embeddings_are_refused_by_name(cls):
    anchors = np.random.default_rng(0).standard_normal((4, 8)).astype("float32")
    with pytest.raises(TypeError, match=r"column 0 \(anchor\) is a ndarray \(convert it with torch.from_numpy\)"):
        cls(None).compute_loss_from_embeddings([anchors, torch.from_numpy(anchors)], None)
    with pytest.raises(TypeError, match=r"column 1 \(positive\) is a list"):
        cls(None).compute_loss_from_embeddings([torch.from_numpy(anchors), anchors.tolist()], None)
