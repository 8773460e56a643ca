"""The ``TrainerCallback`` that connects stateful losses (:class:`~st_hardneg.AdversarialNegativesLoss`) to a Trainer.

A stateful loss keeps training state outside the model (AdCSE: key encoder, adversaries) and checkpoints it inside
the optimizer's ``state_dict`` (see :mod:`st_hardneg.training_hooks`). :class:`StatefulLossCallback` gives it the
Trainer's optimizer at ``on_train_begin``, which the Trainer calls after it has created the optimizer and, on
``trainer.train(resume_from_checkpoint=...)``, loaded ``optimizer.pt`` into it, before the first forward. There the
callback

- restores the loss state saved in the checkpoint, so a resumed run continues bit-exactly;
- warns loudly when the run resumes (``state.global_step > 0``) but the loss's step counter is behind it (a
  checkpoint saved with ``save_only_model=True``, or whose loss entry was removed): the loss state restarts;
- raises when the optimizer holds none of the online model's parameters (FSDP / DeepSpeed ZeRO-3 flat parameters,
  or an optimizer for another model), the case in which the loss would otherwise never update.

Usage::

    # st_hardneg.training.train adds it automatically. With a plain SentenceTransformerTrainer:
    trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=ds, loss=loss,
                                         callbacks=[StatefulLossCallback(loss)])
    # or, for any trainer (also with a loss factory or a dict of losses): add_stateful_loss_callback(trainer)

``model.fit`` accepts no callbacks (sentence-transformers 6.2): there the loss still updates at every optimizer
step, and restores a checkpoint at the first step after resuming (one step late, with a warning).
"""

from __future__ import annotations

from typing import Any

from torch import nn
from transformers import TrainerCallback

from st_hardneg.training_hooks import OptimizerDrivenLoss

__all__ = ["StatefulLossCallback", "add_stateful_loss_callback", "find_stateful_losses"]


def _is_stateful(module: Any) -> bool:
    return isinstance(module, OptimizerDrivenLoss)


def find_stateful_losses(loss: Any) -> list[nn.Module]:
    """The stateful losses inside ``loss``: a module (searched with its submodules) or a dict of them."""
    found: list[nn.Module] = []
    for item in (loss.values() if isinstance(loss, dict) else [loss]):
        if isinstance(item, nn.Module):
            found.extend(m for m in item.modules() if _is_stateful(m) and not any(m is f for f in found))
    return found


class StatefulLossCallback(TrainerCallback):
    """Attach stateful losses to the Trainer's optimizer at ``on_train_begin`` (restore, check, warn).

    Args:
        *losses: the losses (modules containing them are searched too).
    """

    def __init__(self, *losses: nn.Module) -> None:
        found = [loss for item in losses for loss in find_stateful_losses(item)]
        if not found:
            raise ValueError(
                "StatefulLossCallback needs at least one stateful loss (e.g. AdversarialNegativesLoss), got "
                f"{[type(item).__name__ for item in losses]}"
            )
        self.losses = found

    def on_train_begin(self, args, state, control, optimizer=None, **kwargs):
        if optimizer is None:
            raise RuntimeError("StatefulLossCallback.on_train_begin received no optimizer from the Trainer")
        for loss in self.losses:
            loss.on_train_begin(optimizer, global_step=state.global_step)
        return control


def add_stateful_loss_callback(trainer: Any) -> StatefulLossCallback | None:
    """Add a :class:`StatefulLossCallback` for the stateful losses of ``trainer.loss``, if any (idempotent)."""
    if any(isinstance(cb, StatefulLossCallback) for cb in trainer.callback_handler.callbacks):
        return None
    losses = find_stateful_losses(getattr(trainer, "loss", None))
    if not losses:
        return None
    callback = StatefulLossCallback(*losses)
    trainer.add_callback(callback)
    return callback
