"""Plumbing that lets a *stateful* loss follow the optimizer of whatever loop trains it.

sentence-transformers never hands a loss the optimizer, the trainer or any callback, yet a loss such as
:class:`~st_hardneg.AdversarialNegativesLoss` (AdCSE) must act once per optimizer step (EMA key encoder,
adversary ascent) and must be checkpointed together with the optimizer. This module provides the three pieces,
written against plain ``torch.optim`` so that they hold under ``model.fit``, ``SentenceTransformerTrainer`` and
hand-written loops alike:

1. **Step listeners** (:func:`add_step_listener`). One process-wide
   ``torch.optim.optimizer.register_optimizer_step_post_hook`` (registered once, lazily) calls
   ``listener._after_optimizer_step(optimizer)`` on every *live* listener after every completed ``step()`` of
   any optimizer. Listeners are held in a ``WeakSet``: a loss that is garbage collected stops listening, nothing
   leaks across trainers or tests. Listeners decide themselves which optimizers concern them (AdCSE: those
   that hold the online model's parameters). The hook fires inside ``Optimizer.step`` (torch/optim/optimizer.py,
   ``profile_hook_step``) for every optimizer class, foreach or fused alike, so it does not depend on parameter
   versions (fused AdamW does not bump ``param._version``). A step that a ``GradScaler`` skips never calls
   ``optimizer.step`` (accelerate/optimizer.py ``AcceleratedOptimizer.step`` → ``scaler.step``), so it never
   reaches a listener.

2. **Optimizer checkpoints** (:func:`attach_to_optimizer`). A loss attached to an optimizer is saved *inside* the
   optimizer's ``state_dict()`` (a ``register_state_dict_post_hook`` adds one entry under the key
   :data:`STATE_KEY` to ``state_dict["state"]``) and restored from it. The HF Trainer writes
   ``torch.save(self.optimizer.state_dict(), "optimizer.pt")`` into every checkpoint and reloads it with
   ``self.optimizer.load_state_dict(torch.load(..., weights_only=True))`` on resume, so the loss state travels
   with every checkpoint without extra files or arguments, and never ends up in the saved *model*. On load,
   ``Optimizer.load_state_dict`` keeps state entries that do not belong to a parameter "as is" (documented
   backward-compatibility behaviour), so the entry survives even when the loss has not met the new optimizer yet;
   it is consumed (and removed) as soon as the loss attaches, or immediately by a
   ``register_load_state_dict_post_hook`` when the loss was attached before loading.

3. **Finding the Trainer's optimizer before the first forward** (:func:`find_calling_trainer`). On resume the HF
   Trainer creates a *new* optimizer and loads ``optimizer.pt`` into it before the first training forward, but the
   loss only sees that optimizer at its first ``step()`` — one forward too late for an exact resume. So, in
   ``forward``, the loss looks up the Trainer that is calling it: the nearest stack frame of a method named
   ``compute_loss`` whose ``self`` is a ``transformers.Trainer`` (``BaseTrainer.compute_loss`` calls the loss
   directly), and attaches to ``trainer.optimizer``. Custom loops call ``loss.attach_optimizer(optimizer)``
   before ``optimizer.load_state_dict(...)`` instead.
"""

from __future__ import annotations

import sys
import weakref
from typing import Any, Protocol

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

#: key of the st-hardneg entry inside ``optimizer.state_dict()["state"]``
STATE_KEY = "st_hardneg"


class StatefulLoss(Protocol):
    """What a loss implements to be driven by the optimizer (see :class:`~st_hardneg.AdversarialNegativesLoss`)."""

    #: stable name of the loss kind inside the optimizer checkpoint
    checkpoint_name: str

    def _after_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None: ...

    def training_state_dict(self) -> dict[str, Any]: ...

    def load_training_state_dict(self, state: dict[str, Any]) -> None: ...


# --------------------------------------------------------------------------- step listeners
_listeners: weakref.WeakSet = weakref.WeakSet()
_global_hook_handle = None


def _global_step_post_hook(optimizer: torch.optim.Optimizer, args, kwargs) -> None:
    for listener in list(_listeners):
        listener._after_optimizer_step(optimizer)


def add_step_listener(listener: StatefulLoss) -> None:
    """Call ``listener._after_optimizer_step(optimizer)`` after every completed optimizer step (weakly held)."""
    global _global_hook_handle
    if _global_hook_handle is None:
        _global_hook_handle = register_optimizer_step_post_hook(_global_step_post_hook)
    _listeners.add(listener)


# --------------------------------------------------------------------------- optimizer checkpoints
# optimizer -> [weakref(loss), ...] in attach order; the order tells apart several losses of the same kind.
_attached: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def unwrap_optimizer(optimizer: Any) -> torch.optim.Optimizer:
    """The torch optimizer inside wrappers such as accelerate's ``AcceleratedOptimizer`` (``.optimizer``)."""
    seen = 0
    while isinstance(getattr(optimizer, "optimizer", None), torch.optim.Optimizer) and seen < 8:
        optimizer = optimizer.optimizer
        seen += 1
    return optimizer


def _live_losses(optimizer: torch.optim.Optimizer) -> list[tuple[str, StatefulLoss]]:
    """(checkpoint slot name, loss) of the live losses attached to ``optimizer``."""
    slots, counts = [], {}
    for ref in _attached.get(optimizer, []):
        loss = ref()
        if loss is None:
            continue
        index = counts.get(loss.checkpoint_name, 0)
        counts[loss.checkpoint_name] = index + 1
        slots.append((f"{loss.checkpoint_name}.{index}", loss))
    return slots


def _state_dict_post_hook(optimizer: torch.optim.Optimizer, state_dict: dict[str, Any]) -> None:
    losses = _live_losses(optimizer)
    if not losses:
        return
    entry = dict(state_dict["state"].get(STATE_KEY, {}))  # keep entries of losses that have not attached yet
    entry.update({slot: loss.training_state_dict() for slot, loss in losses})
    state_dict["state"][STATE_KEY] = entry


def _load_state_dict_post_hook(optimizer: torch.optim.Optimizer) -> None:
    consume_pending_state(optimizer)


def consume_pending_state(optimizer: torch.optim.Optimizer) -> list[StatefulLoss]:
    """Hand the checkpointed entries found in ``optimizer.state`` to the attached losses; return those restored."""
    pending = optimizer.state.get(STATE_KEY)  # a defaultdict: .get does not insert
    if not isinstance(pending, dict):
        return []
    restored = []
    for slot, loss in _live_losses(optimizer):
        if slot in pending:
            loss.load_training_state_dict(pending.pop(slot))
            restored.append(loss)
    if not pending:
        del optimizer.state[STATE_KEY]
    return restored


def attach_to_optimizer(loss: StatefulLoss, optimizer: Any) -> bool:
    """Checkpoint ``loss`` inside ``optimizer.state_dict()`` from now on, and restore it from a loaded checkpoint.

    Idempotent. Returns ``True`` if a checkpointed state for ``loss`` was waiting in the optimizer and has just
    been restored.
    """
    optimizer = unwrap_optimizer(optimizer)
    refs = _attached.get(optimizer)
    if refs is None:
        refs = _attached[optimizer] = []
        optimizer.register_state_dict_post_hook(_state_dict_post_hook)
        optimizer.register_load_state_dict_post_hook(_load_state_dict_post_hook)
    if any(ref() is loss for ref in refs):
        return False
    refs.append(weakref.ref(loss))
    return loss in consume_pending_state(optimizer)


def is_attached(loss: StatefulLoss, optimizer: Any) -> bool:
    return any(ref() is loss for ref in _attached.get(unwrap_optimizer(optimizer), []))


# --------------------------------------------------------------------------- the calling Trainer
def find_calling_trainer(max_depth: int = 24) -> Any | None:
    """The ``transformers.Trainer`` whose ``compute_loss`` is (directly or indirectly) calling us, if any.

    Only frames of functions named ``compute_loss`` are inspected, so the walk is cheap (no ``f_locals`` of other
    frames is materialised).
    """
    trainer_cls = None
    frame = sys._getframe(1)
    for _ in range(max_depth):
        if frame is None:
            return None
        if frame.f_code.co_name == "compute_loss":
            candidate = frame.f_locals.get("self")
            if trainer_cls is None:
                from transformers import Trainer as trainer_cls
            if isinstance(candidate, trainer_cls):
                return candidate
        frame = frame.f_back
    return None
