"""``functional.normalize``: its own backward equals autograd's through ``x / max(||x||, eps)`` (values and
gradients, float64 and float32, rows below eps and overflowing rows) and saves only its output and (N, 1) columns,
so a cached loss holds no extra (N, d) tensor per column until its backward."""

from __future__ import annotations

import pytest
import torch

from st_hardneg import functional as fn


def _composed(x: torch.Tensor) -> torch.Tensor:
    return x / fn.row_norms(x).clamp_min(fn.NORM_EPS)


def _rows(dtype: torch.dtype) -> torch.Tensor:
    torch.manual_seed(0)
    x = torch.randn(6, 5, dtype=dtype)
    x[1] *= 1e-8  # norm below NORM_EPS: divided by the constant eps
    x[2] = 0.0  # a zero row stays zero, gradient g / eps
    x[3] *= 3e3
    return x


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_values_and_gradients_equal_the_autograd_composition(dtype):
    x = _rows(dtype)
    if dtype == torch.float32:
        x[4] = 1e20  # squares overflow float32: row_norms' scaling keeps the norm finite
    grad = torch.randn(x.shape, dtype=dtype, generator=torch.Generator().manual_seed(1))
    ours, reference = x.clone().requires_grad_(), x.clone().requires_grad_()
    y, y_ref = fn.normalize(ours), _composed(reference)
    assert torch.equal(y, y_ref)  # the same forward operations
    y.backward(grad)
    y_ref.backward(grad)
    tolerance = {"rtol": 1e-12, "atol": 1e-12} if dtype == torch.float64 else {"rtol": 1e-5, "atol": 1e-6}
    torch.testing.assert_close(ours.grad, reference.grad, **tolerance)
    torch.testing.assert_close(ours.grad[2], grad[2] / fn.NORM_EPS, **tolerance)  # the zero row's gradient
    assert torch.isfinite(ours.grad).all()


def test_gradcheck_float64():
    x = _rows(torch.float64)[[0, 3, 5]].requires_grad_()  # rows far from the kink at ||x|| = eps (finite differences)
    assert torch.autograd.gradcheck(fn.normalize, (x,))


def _saved_elements(func, x: torch.Tensor) -> int:
    saved = []

    def pack(tensor):
        saved.append(tensor)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        func(x)
    distinct = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() // t.element_size() for t in saved}
    return sum(distinct.values())


def test_backward_saves_only_the_output_and_row_columns():
    n, d = 64, 16
    x = torch.randn(n, d).requires_grad_()
    ours = _saved_elements(fn.normalize, x)
    assert ours <= n * d + 2 * n  # y, the (n, 1) divisor and the (n, 1) mask
    # autograd's composition also keeps x and row_norms' scaled copy of x (which x's owner does not hold)
    assert _saved_elements(_composed, x) >= ours + n * d
