"""cosine_spearman refuses inputs that would end in NaN or in numpy's shape errors."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import spearmanr

from st_hardneg.evaluation.sts import cosine_spearman

A = np.array([[1.0, 0.0], [0.6, 0.8], [0.0, 1.0], [0.8, 0.6]])
B = np.array([[1.0, 0.1], [1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])


def test_a_nan_gold_score_is_refused_naming_its_index():
    with pytest.raises(ValueError, match="gold has 1 non-finite score.*first at index 2"):
        cosine_spearman(A, B, [1.0, 2.0, float("nan"), 4.0])


def test_one_dimensional_embeddings_are_named():
    with pytest.raises(ValueError, match=r"embeddings1 must be a 2-D array .* got shape \(4,\)"):
        cosine_spearman(A[:, 0], B, [1, 2, 3, 4])


def test_width_mismatched_embeddings_are_named():
    with pytest.raises(ValueError, match="embeddings1 and embeddings2 must have the same width, got 2 and 1"):
        cosine_spearman(A, B[:, :1], [1, 2, 3, 4])


def test_valid_inputs_equal_scipy():
    gold = [4.0, 1.0, 2.0, 3.0]
    cos = (A * B).sum(1) / np.linalg.norm(A, axis=1) / np.linalg.norm(B, axis=1)
    assert cosine_spearman(A, B, gold) == pytest.approx(100 * spearmanr(cos, gold).statistic)
