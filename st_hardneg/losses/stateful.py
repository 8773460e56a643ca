"""Plumbing that lets a *stateful* loss follow the optimizer of whatever loop trains it.

sentence-transformers never hands a loss the optimizer, the trainer or any callback, yet a loss such as
:class:`~st_hardneg.AdversarialNegativesLoss` (AdCSE) must act once per optimizer step (EMA key encoder,
adversary ascent) and must be checkpointed together with the optimizer. This module provides the pieces,
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

3. **Flattened parameters** (:func:`is_flattened_parameter`). Losses that match parameters by identity or by name
   (the EMA, the optimizer-ownership test) cannot follow FSDP / DeepSpeed ZeRO-3, which replace the model's
   parameters by flat shards; this predicate lets them detect that case and fail loudly instead of never updating.

**Why the per-step update is an optimizer step post-hook, not a TrainerCallback.** The update must run once per
*completed* ``optimizer.step()``: a ``TrainerCallback.on_optimizer_step`` also fires for a step that a
``GradScaler`` skipped, and ``model.fit`` (sentence-transformers 6.2) accepts no callbacks at all, while a torch
step post-hook fires in every loop (Trainer, ``model.fit``, hand-written), never for a skipped step, and for every
optimizer class (fused AdamW does not bump parameter versions). The loss acts only on optimizers that hold its
online model's parameters. What a hook cannot do is see the optimizer *before* the first forward of a resumed run;
that is the explicit part: :class:`st_hardneg.training.callbacks.StatefulLossCallback` (added by
:func:`st_hardneg.training.loop.train`; pass it to a plain ``SentenceTransformerTrainer``) attaches the loss at
``on_train_begin``, right after the Trainer has loaded ``optimizer.pt``, and the state saved in it comes back
before the first step. Custom loops call :meth:`OptimizerDrivenLoss.attach_optimizer` before
``optimizer.load_state_dict``. Without either (``model.fit``), a checkpointed state is restored one step late,
with a warning.

**Accumulation window (AdCSE).** The adversary gradient of each training forward is added to a window that the next
optimizer step averages and consumes. The window restarts only if a backward has run since its last micro-batch
*and* the online gradients are cleared now (``zero_grad`` after a step a ``GradScaler`` skipped): several forwards
before one backward all count. ``zero_grad(set_to_none=False)`` cannot be told apart from a kept window.
"""

from __future__ import annotations

import logging
import warnings
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, cast

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

#: key of the st-hardneg entry inside ``optimizer.state_dict()["state"]``
STATE_KEY = "st_hardneg"

logger = logging.getLogger(__name__)


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


def _global_step_post_hook(optimizer: torch.optim.Optimizer, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
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
    counts: dict[str, int]
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
    restored = consume_pending_state(optimizer)
    missing = [slot for slot, loss in _live_losses(optimizer) if not any(loss is r for r in restored)]
    if missing:
        logger.warning(
            "The optimizer checkpoint just loaded holds no state for %s: their key encoder, adversaries and update "
            "counters keep their current (fresh) values and training continues from there, not from the "
            "checkpoint.", ", ".join(missing)
        )


def consume_pending_state(optimizer: torch.optim.Optimizer) -> list[StatefulLoss]:
    """Hand the checkpointed entries found in ``optimizer.state`` to the attached losses; return those restored."""
    pending = cast(dict[Any, Any], optimizer.state).get(STATE_KEY)  # a defaultdict: .get does not insert
    if not isinstance(pending, dict):
        return []
    restored = []
    for slot, loss in _live_losses(optimizer):
        if slot in pending:
            loss.load_training_state_dict(pending.pop(slot))
            restored.append(loss)
    if not pending:
        del cast(dict[Any, Any], optimizer.state)[STATE_KEY]
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


# --------------------------------------------------------------------------- flattened parameters
def is_flattened_parameter(param: Any) -> bool:
    """Whether ``param`` is a flat shard of FSDP (``FlatParameter``) or a DeepSpeed ZeRO-3 partitioned parameter."""
    return (
        type(param).__name__ == "FlatParameter"
        or bool(getattr(param, "_is_flat_param", False))
        or hasattr(param, "ds_id")
    )


# --------------------------------------------------------------------------- the mixin a stateful loss uses
@dataclass
class StepClock:
    """The optimizer steps a stateful part (a loss, a queue) has acted on and the training forwards since the last
    one: cross-batch state that the part owns and changes in place."""

    steps: int = 0
    forwards_since_step: int = 0



_FLAT_MESSAGE = (
    "the model's parameters are flattened (FSDP / DeepSpeed ZeRO-3), which {name} does not support: it matches the "
    "model's own parameters (EMA, optimizer test). Use DDP or a single device."
)


class OptimizerDrivenLoss:
    """Mixin (put it before ``nn.Module`` in the bases) for a loss whose state moves once per optimizer step of its
    online model and is checkpointed inside that optimizer.

    The subclass provides ``checkpoint_name``, ``model``, ``online_model``, ``training_state_dict``,
    ``load_training_state_dict`` and ``update_state()`` (the update itself); it calls :meth:`_start_listening`
    at the end of ``__init__``, and :meth:`_check_online_model` and :meth:`_count_forward` in every ``forward``.
    The mixin counts the steps it acted on and the training forwards since the last one in :attr:`step_clock`
    (changed in place; the subclass saves and restores its ``steps``).
    """

    checkpoint_name: str

    if TYPE_CHECKING:  # provided by nn.Module and the subclass
        training: bool
        model: torch.nn.Module

        @property
        def online_model(self) -> torch.nn.Module: ...

        def training_state_dict(self) -> dict[str, Any]: ...

        def load_training_state_dict(self, state: dict[str, Any]) -> None: ...

        def update_state(self) -> None: ...

    @property
    def step_clock(self) -> StepClock:
        """The optimizer steps acted on and the training forwards since the last one."""
        return cast(StepClock, vars(self)["_step_clock"])

    def _count_forward(self) -> None:
        """Note a training forward (one whose step is still to come)."""
        if self.training and torch.is_grad_enabled():
            self.step_clock.forwards_since_step += 1

    def _check_online_model(self) -> None:
        """``self.model`` may be a wrapper of the online model (DDP, compile), never another model (or shards)."""
        if id(self.model) == getattr(self, "_checked_model_id", None):
            return
        if next(self.model.parameters(), None) is not next(self.online_model.parameters(), None):
            if any(map(is_flattened_parameter, self.model.parameters())):
                raise self._flat_error()
            if self.follow_model(self.model):  # no state of the old model's (the Trainer's model_init)
                self._owned_optimizers.clear()  # they held the old model
                self._checked_model_id = id(self.model)
                return
            raise RuntimeError(
                f"{type(self).__name__} is asked to train another model than the one it was built for (e.g. the "
                "Trainer's model_init replaced loss.model), while its state (AdCSE: the key encoder) belongs to the "
                "old model. Build the loss for the model that is trained; model_init is not supported.")
        self._checked_model_id = id(self.model)

    def follow_model(self, model: torch.nn.Module) -> bool:
        """Called when ``loss.model`` was re-pointed to another model (the Trainer's ``model_init``): follow it, and
        return ``True``, if nothing the loss keeps belongs to the old model; ``False`` (the default) refuses it."""
        return False

    def _start_listening(self) -> None:
        if "_step_clock" not in vars(self):  # kept by a copy (deepcopy, unpickling)
            vars(self)["_step_clock"] = StepClock()
        self._owned_optimizers: Any = weakref.WeakSet()
        add_step_listener(self)

    def __setstate__(self, state: dict[str, Any]) -> None:  # deepcopy / unpickling bypass __init__
        cast(Any, super()).__setstate__(state)
        self._start_listening()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("_owned_optimizers", None)  # weak references do not copy or pickle
        return state

    def attach_optimizer(self, optimizer: torch.optim.Optimizer) -> bool:
        """Checkpoint this loss inside ``optimizer.state_dict()`` and restore it from ``optimizer.load_state_dict``.

        In a custom loop call it before ``optimizer.load_state_dict(...)``. Returns ``True`` if a saved state was
        waiting in the optimizer and has been restored now.
        """
        return attach_to_optimizer(self, optimizer)

    def _owns(self, optimizer: torch.optim.Optimizer) -> bool:
        """Whether ``optimizer`` steps the online model (cached per optimizer once true)."""
        if optimizer in self._owned_optimizers:
            return True
        online_ids = {id(p) for p in self.online_model.parameters()}
        if any(id(p) in online_ids for group in optimizer.param_groups for p in group["params"]):
            self._owned_optimizers.add(optimizer)
            return True
        return False

    def _flat_error(self) -> RuntimeError:
        name = type(self).__name__
        return RuntimeError(f"{name}: " + _FLAT_MESSAGE.format(name=name))

    def on_train_begin(self, optimizer: Any, global_step: int = 0) -> None:
        """Attach to the loop's optimizer before the first forward (called by the ``StatefulLossCallback``).

        Raises if ``optimizer`` holds none of the online model's parameters; warns if the run resumes at
        ``global_step > 0`` without a saved state for this loss (its state then restarts).
        """
        optimizer = unwrap_optimizer(optimizer)
        if not self._owns(optimizer):
            if any(is_flattened_parameter(p) for group in optimizer.param_groups for p in group["params"]):
                raise self._flat_error()
            raise RuntimeError(
                f"{type(self).__name__} cannot follow this optimizer: it holds none of the online model's parameters "
                "(an optimizer of another model?), so the loss state would never be updated.")
        if not self.attach_optimizer(optimizer) and global_step > 0 and self.step_clock.steps == 0:
            warnings.warn(
                f"Resuming at step {global_step} without a saved {self.checkpoint_name} state in the optimizer "
                "checkpoint (saved with save_only_model=True, or the entry was removed): the loss state restarts "
                "(AdCSE: the key encoder becomes a copy of the current model, the adversaries their initialisation).",
                RuntimeWarning, stacklevel=2)

    def _after_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Called after every completed ``step()`` of any optimizer; acts on those of the online model."""
        if not self._owns(optimizer):
            if self.step_clock.forwards_since_step and any(
                    is_flattened_parameter(p) for group in optimizer.param_groups for p in group["params"]):
                raise self._flat_error()
            return
        if not is_attached(self, optimizer) and self.attach_optimizer(optimizer):
            logger.warning(
                "%s restored its checkpointed state only at the first optimizer step after resuming, so that step "
                "used a fresh state. Pass StatefulLossCallback(loss) to the Trainer, or call "
                "loss.attach_optimizer(optimizer) before optimizer.load_state_dict(...) in a custom loop.",
                type(self).__name__)
        self.update_state()
        self.step_clock.steps += 1
        self.step_clock.forwards_since_step = 0
