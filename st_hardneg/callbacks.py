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

__all__ = ["FalseNegativeLog", "StatefulLossCallback", "add_stateful_loss_callback", "find_stateful_losses"]


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


class FalseNegativeLog(TrainerCallback):
    """Counts, after every optimizer step, the candidates an st-hardneg loss masked as false negatives in its last
    batch (``loss.diagnostics["masked_false_negatives_total"]``, 0 before anything was masked), so a run can report
    how much its false-negative control actually did.

    With gradient accumulation or GradCache the count is that of the step's last forward.

    Usage::

        log = FalseNegativeLog(loss)
        trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=ds, loss=loss, callbacks=[log])
        trainer.train()
        log.summary()   # {"steps": 40, "masked_total": 113.0, "masked_per_batch": 2.825, "batches_with_any": 31}

    Args:
        loss: a loss with a ``diagnostics`` mapping (every st-hardneg loss).

    Raises:
        TypeError: ``loss`` has no ``diagnostics``.
    """

    def __init__(self, loss: nn.Module) -> None:
        if not hasattr(loss, "diagnostics"):
            raise TypeError(f"FalseNegativeLog needs a loss with `diagnostics` (an st-hardneg loss), got "
                            f"{type(loss).__name__}")
        self.loss = loss
        #: masked candidates of each optimizer step's last batch
        self.per_step: list[float] = []

    def on_step_end(self, args, state, control, **kwargs):
        self.per_step.append(float(self.loss.diagnostics.get("masked_false_negatives_total", 0.0)))

    def summary(self) -> dict[str, float | int]:
        """``steps``, ``masked_total``, ``masked_per_batch`` (mean over steps) and ``batches_with_any``."""
        steps = len(self.per_step)
        total = sum(self.per_step)
        return {"steps": steps, "masked_total": total, "masked_per_batch": total / steps if steps else 0.0,
                "batches_with_any": sum(1 for value in self.per_step if value > 0)}
