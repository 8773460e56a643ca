"""Momentum (EMA) encoders: a frozen copy of a model that follows it as an exponential moving average.

Two functions, usable with any ``nn.Module`` (MoCo-style key encoders, BYOL/DINO teachers, EMA weights):

>>> key_encoder = frozen_copy(model)            # exact copy, no gradients, train mode
>>> update_momentum(model, key_encoder, m=0.995)  # after each optimizer step: θ_ema ← m·θ_ema + (1-m)·θ

After ``k`` updates with online parameters ``θ_1..θ_k`` (taken after each step) the copy holds the closed form
``m^k·θ_0 + (1-m)·Σ_t m^(k-t)·θ_t``.
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn

from st_hardneg import validation

__all__ = ["frozen_copy", "update_momentum"]


def frozen_copy(model: nn.Module) -> nn.Module:
    """An exact deep copy of ``model`` with ``requires_grad=False`` everywhere, in train mode.

    A sentence-transformers ``model_card_data`` object (training metadata, not weights) is shared, not copied.
    """
    memo = {}
    card = getattr(model, "model_card_data", None)
    if card is not None:
        memo[id(card)] = card
    ema = copy.deepcopy(model, memo)
    ema.requires_grad_(False)
    ema.train()
    return ema


@torch.no_grad()
def update_momentum(model: nn.Module, model_ema: nn.Module, m: float, copy_buffers: bool = False) -> int:
    """One EMA step of ``model_ema`` towards ``model``: ``θ_ema ← m·θ_ema + (1 - m)·θ`` for every parameter.

    Parameters are matched by name (``named_parameters()``), so the two modules must have the same structure;
    ``model`` may live on another device or in another dtype (each source is cast to its EMA tensor's device
    and dtype, the EMA keeps its own).

    Args:
        model: the online module (read only).
        model_ema: the EMA copy, updated in place (e.g. made with :func:`frozen_copy`).
        m: momentum in [0, 1]; ``1`` leaves the copy unchanged, ``0`` copies ``model``.
        copy_buffers: also copy every buffer of ``model`` into ``model_ema`` (e.g. BatchNorm statistics).
            ``False`` (default) leaves the EMA's buffers as they are.

    Returns:
        The number of parameters updated.

    Raises:
        ValueError: ``m`` outside [0, 1].
        RuntimeError: a parameter (or buffer, with ``copy_buffers``) of ``model_ema`` has no counterpart of the
            same shape in ``model``, or ``model_ema`` has parameters but none of them matched (e.g. ``model`` is
            wrapped by FSDP / DeepSpeed ZeRO-3, which flatten parameters under other names).
    """
    m = validation.check_unit_interval(m, "momentum m")
    online = dict(model.named_parameters())
    targets: list[Tensor]
    sources: list[Tensor]
    target: Tensor
    source: Tensor | None
    targets, sources = [], []
    for name, target in model_ema.named_parameters():
        source = online.get(name)
        if source is None or source.shape != target.shape:
            found = "no such parameter" if source is None else f"shape {tuple(source.shape)}"
            raise RuntimeError(
                f"update_momentum: the EMA parameter {name!r} {tuple(target.shape)} has no counterpart in the online "
                f"model ({found}); the online model has {len(online)} parameters. Both must have the same structure "
                "(a model wrapped by FSDP or DeepSpeed ZeRO-3 flattens its parameters and is not supported)."
            )
        targets.append(target)
        sources.append(source.detach().to(device=target.device, dtype=target.dtype))
    if targets:
        torch._foreach_lerp_(targets, sources, 1.0 - m)
    if copy_buffers:
        online_buffers = dict(model.named_buffers())
        for name, target in model_ema.named_buffers():
            source = online_buffers.get(name)
            if source is None or source.shape != target.shape:
                raise RuntimeError(f"update_momentum: the EMA buffer {name!r} has no counterpart in the online model")
            target.copy_(source)
    return len(targets)
