"""st_hardneg.losses.momentum: the EMA update on its own (closed form, buffers, dtype, errors)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from st_hardneg.losses.momentum import frozen_copy, update_momentum


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))


def test_closed_form_after_k_updates():
    m, k = 0.7, 4
    online = _net()
    ema = frozen_copy(online)
    theta0 = {n: p.detach().clone() for n, p in online.named_parameters()}
    history = []
    for step in range(k):
        with torch.no_grad():  # the online model moves (as an optimizer would), then the EMA follows
            for p in online.parameters():
                p.add_(torch.randn_like(p) * (step + 1))
        history.append({n: p.detach().clone() for n, p in online.named_parameters()})
        assert update_momentum(online, ema, m) == 6
    for name, target in ema.named_parameters():
        # m^k θ0 + (1-m) Σ_t m^(k-t) θ_t, written element by element
        flat0, flat = theta0[name].flatten().tolist(), target.detach().flatten().tolist()
        for idx, got in enumerate(flat):
            expected = m**k * flat0[idx] + sum(
                (1 - m) * m ** (k - t) * history[t - 1][name].flatten()[idx].item() for t in range(1, k + 1))
            assert got == pytest.approx(expected, rel=1e-5, abs=1e-6), (name, idx)


def test_extreme_momenta_are_exact():
    online, ema = _net(), _net()
    with torch.no_grad():
        for p in ema.parameters():
            p.mul_(3.0).add_(1.0)
    before = [p.clone() for p in ema.parameters()]
    update_momentum(online, ema, 1.0)
    assert all(torch.equal(a, b) for a, b in zip(before, ema.parameters(), strict=True))
    update_momentum(online, ema, 0.0)
    assert all(torch.equal(a, b) for a, b in zip(online.parameters(), ema.parameters(), strict=True))


def test_buffers_are_left_alone_unless_asked():
    online = _net()
    ema = frozen_copy(online)
    online.train()
    online(torch.randn(8, 3))  # moves BatchNorm's running statistics of the online model only
    assert not torch.equal(online[1].running_mean, ema[1].running_mean)
    update_momentum(online, ema, 0.5)
    assert torch.equal(ema[1].running_mean, torch.zeros(4))  # untouched
    update_momentum(online, ema, 0.5, copy_buffers=True)
    assert torch.equal(ema[1].running_mean, online[1].running_mean)
    assert int(ema[1].num_batches_tracked) == 1


def test_dtype_of_the_ema_is_kept_and_updated_in_place():
    online = _net().double()
    ema = frozen_copy(_net())  # float32
    ptrs = [p.data_ptr() for p in ema.parameters()]
    expected = [(0.25 * e.double() + 0.75 * o).float() for e, o in zip(ema.parameters(), online.parameters(),
                                                                       strict=True)]
    update_momentum(online, ema, 0.25)
    assert [p.data_ptr() for p in ema.parameters()] == ptrs
    for p, e in zip(ema.parameters(), expected, strict=True):
        assert p.dtype == torch.float32 and p.device.type == "cpu"
        torch.testing.assert_close(p, e, rtol=1e-6, atol=1e-6)


def test_frozen_copy():
    online = _net()
    online.eval()
    ema = frozen_copy(online)
    assert ema.training and all(not p.requires_grad for p in ema.parameters())
    assert all(p.requires_grad for p in online.parameters()) and not online.training
    state, ema_state = online.state_dict(), ema.state_dict()
    assert all(torch.equal(state[k], ema_state[k]) for k in state)
    assert all(a.data_ptr() != b.data_ptr() for a, b in zip(online.parameters(), ema.parameters(), strict=True))


@pytest.mark.parametrize("m", [1.5, -0.1, float("nan"), True, "high"])
def test_rejects_bad_momentum(m):
    with pytest.raises(ValueError, match="momentum m"):
        update_momentum(_net(), _net(), m)


def test_rejects_mismatched_structures():
    with pytest.raises(RuntimeError, match="no counterpart"):
        update_momentum(nn.Linear(3, 4), nn.Linear(3, 5), 0.5)  # shapes
    flat = nn.Module()
    flat.flat_param = nn.Parameter(torch.zeros(100))  # what FSDP / ZeRO-3 leave of a model
    with pytest.raises(RuntimeError, match="FSDP"):
        update_momentum(flat, _net(), 0.5)
