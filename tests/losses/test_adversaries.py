"""NegativeAdversaries on its own: the momentum-SGD ascent against a hand-written update."""

from __future__ import annotations

import pytest
import torch

from st_hardneg.losses.adversaries import NegativeAdversaries


def _linear_loss(coeff):
    """L(x, n) = Σ coeff ⊙ n (+ 0·x): its gradient with respect to n is ``coeff`` exactly."""
    return lambda x, n: (coeff * n).sum() + 0 * x.sum()


def test_step_matches_a_hand_written_momentum_sgd_ascent():
    lr, mu, wd = 0.1, 0.9, 0.01
    bank = NegativeAdversaries(2, 3, lr=lr, momentum=mu, weight_decay=wd, generator=torch.Generator().manual_seed(0))
    w = bank.weight.tolist()
    v = [[0.0] * 3 for _ in range(2)]
    grads = [torch.tensor([[1.0, -2.0, 0.5], [0.0, 3.0, -1.0]]), torch.tensor([[0.5, 0.5, 0.5], [-1.0, 2.0, 1.0]])]
    for g in grads:  # two steps: the second one checks the momentum
        bank.accumulate(_linear_loss(g), torch.zeros(1))
        assert bank.step()
        for i in range(2):
            for j in range(3):
                v[i][j] = mu * v[i][j] + (-g[i, j].item() + wd * w[i][j])
                w[i][j] = w[i][j] - lr * v[i][j]
        torch.testing.assert_close(bank.weight, torch.tensor(w), rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(bank.velocity, torch.tensor(v), rtol=1e-6, atol=1e-7)
    assert bank.updates == 2 and bank.pending_micro_batches == 0


def test_window_is_averaged_and_reset():
    bank = NegativeAdversaries(1, 2, lr=1.0, momentum=0.0, weight_decay=0.0)
    w0 = bank.weight.clone()
    for g in ([2.0, 0.0], [0.0, 4.0], [1.0, 2.0]):
        bank.accumulate(_linear_loss(torch.tensor([g])), torch.zeros(1))
    assert bank.pending_micro_batches == 3
    bank.step()
    torch.testing.assert_close(bank.weight, w0 + torch.tensor([[1.0, 2.0]]))  # ascent along the mean (1, 2)
    # A reset window contributes nothing; an empty window is no step.
    bank.accumulate(_linear_loss(torch.tensor([[9.0, 9.0]])), torch.zeros(1))
    bank.reset_window()
    before = bank.weight.clone()
    assert not bank.step() and torch.equal(bank.weight, before) and bank.updates == 1


def test_gradient_is_float32_and_leaves_inputs_alone():
    bank = NegativeAdversaries(3, 4, generator=torch.Generator().manual_seed(1))
    x = torch.randn(5, 4, dtype=torch.float64, requires_grad=True)
    seen = []

    def loss_fn(inp, n):
        seen.append((inp.dtype, inp.requires_grad, n.dtype, n.requires_grad))
        return (inp.sum(0, keepdim=True) * n).sum()

    grad = bank.accumulate(loss_fn, x)
    assert seen == [(torch.float32, False, torch.float32, True)]
    torch.testing.assert_close(grad, x.detach().float().sum(0).expand(3, 4))
    assert x.grad is None


def test_zero_lr_freezes_and_empty_bank_is_a_no_op():
    bank = NegativeAdversaries(2, 2, lr=0.0)
    before = bank.weight.clone()
    bank.accumulate(_linear_loss(torch.ones(2, 2)), torch.zeros(1))
    assert bank.step() and torch.equal(bank.weight, before)
    empty = NegativeAdversaries(0, 0)
    assert len(empty) == 0 and not empty.step() and empty.weight.shape == (0, 0)


@pytest.mark.parametrize("kwargs", [
    {"num": -1}, {"num": True}, {"num": 2.0}, {"dim": 0}, {"lr": float("nan")}, {"lr": -1.0},
    {"momentum": 1.0}, {"weight_decay": float("inf")}, {"momentum": "high"},
])
def test_rejects_bad_arguments(kwargs):
    args = {"num": 2, "dim": 3, **kwargs}
    with pytest.raises(ValueError):
        NegativeAdversaries(args.pop("num"), args.pop("dim"), **args)
