"""alignment / uniformity refuse what would give a number without meaning."""

from __future__ import annotations

import numpy as np
import pytest

from st_hardneg.evaluation.diagnostics import alignment, uniformity

RNG = np.random.default_rng(0)
X = RNG.normal(size=(6, 4))
Y = RNG.normal(size=(6, 4))


@pytest.mark.parametrize("alpha", [0, -1.0, float("nan")])
def test_alignment_refuses_a_non_positive_alpha(alpha):
    with pytest.raises(ValueError, match="alpha must be a finite number"):
        alignment(X, Y, alpha=alpha)


@pytest.mark.parametrize("t", [0, -2.0, float("inf")])
def test_uniformity_refuses_a_non_positive_t(t):
    with pytest.raises(ValueError, match="t must be a finite number"):
        uniformity(X, t=t)


def test_one_dimensional_embeddings_are_named():
    with pytest.raises(ValueError, match=r"x must be a 2-D array .* got shape \(6,\)"):
        alignment(X[:, 0], Y)
    with pytest.raises(ValueError, match=r"y must be a 2-D array"):
        alignment(X, Y[:, 0])
    with pytest.raises(ValueError, match=r"x must be a 2-D array"):
        uniformity(X[:, 0])


def test_width_mismatched_pairs_are_named():
    with pytest.raises(ValueError, match="x and y must have the same width, got 4 and 3"):
        alignment(X, Y[:, :3])


def test_valid_inputs_give_the_closed_form_values():
    x = np.array([[1.0, 0.0], [0.0, 1.0]])
    y = np.array([[0.0, 1.0], [0.0, 1.0]])
    assert alignment(x, y) == pytest.approx(1.0)  # (2 + 0) / 2
    assert uniformity(x) == pytest.approx(-4.0)  # log exp(-2 * 2)
