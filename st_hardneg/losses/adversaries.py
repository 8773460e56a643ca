"""A bank of learnable negative adversaries (AdCo / AdCSE) with its own momentum-SGD *ascent*.

The bank holds ``M`` free vectors ``n_1..n_M`` (buffers, never parameters: no optimizer ever sees them) and their
momentum buffer. It is trained to *maximise* a contrastive loss in which the vectors are negatives:

1. :meth:`NegativeAdversaries.accumulate` computes ``∂L/∂n`` for one micro-batch (detached inputs, float32, outside
   autocast, so it touches neither the encoder's graph nor its gradients and ignores AMP loss scaling) and adds it
   to the current accumulation window;
2. :meth:`NegativeAdversaries.step` averages the window (and, under ``torch.distributed``, over the processes) and
   applies one momentum-SGD ascent step, weight decay inside the velocity as in ``torch.optim.SGD``::

       v ← μ·v + (-ḡ + wd·n)
       n ← n - lr·v
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import cast

import torch
from torch import Tensor, nn

from st_hardneg import validation

__all__ = ["NegativeAdversaries"]


class NegativeAdversaries(nn.Module):
    """``M`` learnable negatives of dimension ``d`` trained by momentum-SGD ascent on a loss given per call.

    Args:
        num: ``M`` >= 0 (``0`` gives an empty bank whose :meth:`step` does nothing).
        dim: ``d`` >= 1 (may be 0 only when ``num`` is 0).
        lr: learning rate >= 0 (``0`` freezes the bank).
        momentum: μ in [0, 1).
        weight_decay: L2 weight decay >= 0.
        generator: random generator of the standard-normal initialisation (``None``: torch's global one).
        device: where the vectors live.

    Attributes:
        weight: (M, d) buffer, the adversaries (not normalised; losses normalise them).
        velocity: (M, d) buffer, the momentum.
        updates: number of ascent steps taken.
        pending_micro_batches: number of gradients in the current accumulation window.
        backward_seen: whether a backward has run through a micro-batch of the current window
            (:meth:`watch_backward`).
    """

    weight: Tensor
    velocity: Tensor

    def __init__(self, num: int, dim: int, lr: float = 3e-3, momentum: float = 0.9, weight_decay: float = 1e-4,
                 generator: torch.Generator | None = None, device: torch.device | str | None = None) -> None:
        super().__init__()
        num = validation.check_count(num, "num (M)", minimum=0)
        dim = validation.check_count(dim, "dim", minimum=0)
        if num and not dim:
            raise ValueError("dim must be >= 1 when the bank is not empty")
        self.lr = validation.check_non_negative(lr, "adversary_lr")
        self.momentum = validation.check_momentum(momentum, "adversary_momentum")
        self.weight_decay = validation.check_non_negative(weight_decay, "adversary_weight_decay")
        self.register_buffer("weight", torch.randn(num, dim, generator=generator).to(device))
        self.register_buffer("velocity", torch.zeros_like(self.weight))
        self.updates = 0
        self._grad_sum: Tensor | None = None
        self.pending_micro_batches = 0
        self.backward_seen = False

    def __len__(self) -> int:
        return self.weight.size(0)

    def accumulate(self, loss_fn: Callable[..., Tensor], *inputs: Tensor) -> Tensor:
        """Add ``∂ loss_fn(*inputs, adversaries) / ∂ adversaries`` to the accumulation window and return it.

        ``inputs`` are detached and cast to float32; ``loss_fn`` receives them followed by a float32 leaf copy of
        :attr:`weight`.
        """
        grad = self.gradient(loss_fn, *inputs)
        self.add(grad)
        return grad

    def gradient(self, loss_fn: Callable[..., Tensor], *inputs: Tensor) -> Tensor:
        """``∂ loss_fn(*inputs, adversaries) / ∂ adversaries`` (inputs detached, float32), without accumulating it (a
        loss that computes its rows in chunks sums the chunks' gradients and :meth:`add` s them once)."""
        device = self.weight.device
        with torch.enable_grad(), torch.autocast(device_type=device.type, enabled=False):
            leaf = self.weight.detach().float().requires_grad_(True)
            loss = loss_fn(*(x.detach().float() for x in inputs), leaf)
            (grad,) = torch.autograd.grad(loss, leaf)
        return grad

    def add(self, grad: Tensor) -> None:
        """Add one micro-batch's gradient to the accumulation window."""
        self._grad_sum = grad.clone() if self._grad_sum is None else self._grad_sum.add_(grad)
        self.pending_micro_batches += 1

    def reset_window(self) -> None:
        """Forget the gradients accumulated since the last :meth:`step` (a new window: no backward seen yet)."""
        self._grad_sum = None
        self.pending_micro_batches = 0
        self.backward_seen = False

    def watch_backward(self, tensor: Tensor) -> None:
        """Mark the window as back-propagated (``backward_seen``) when a backward runs through ``tensor`` (a
        micro-batch's anchors)."""
        if not tensor.requires_grad:
            return
        ref = weakref.ref(self)

        def seen(grad: Tensor) -> None:
            bank = ref()
            if bank is not None:
                bank.backward_seen = True

        tensor.register_hook(seen)

    @torch.no_grad()
    def step(self) -> bool:
        """One ascent step with the mean gradient of the window; returns ``False`` (no step) on an empty window."""
        if not self.pending_micro_batches or not len(self):
            self.reset_window()
            return False
        grad = cast(Tensor, self._grad_sum) / self.pending_micro_batches
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            world_size = torch.distributed.get_world_size()
            if world_size > 1:
                torch.distributed.all_reduce(grad)
                grad /= world_size
        direction = (-grad).add_(self.weight.float(), alpha=self.weight_decay)
        self.velocity.mul_(self.momentum).add_(direction.to(self.velocity.dtype))
        self.weight.sub_(self.velocity, alpha=self.lr)
        self.updates += 1
        self.reset_window()
        return True

    def extra_repr(self) -> str:
        return f"num={len(self)}, dim={self.weight.size(1)}, lr={self.lr}, momentum={self.momentum}, " \
               f"weight_decay={self.weight_decay}"
