"""A loss built on one model and trained by a Trainer of another: detected and named.

``SentenceTransformerTrainer(model=A, loss=Loss(B))`` makes its optimizer from the loss's parameters (those of B,
the model the loss was built on) and re-points ``loss.model`` to A only inside ``compute_loss``, at the first
training step (``override_model_in_loss``). From then on the loss back-propagates into A, whose parameters no
optimizer holds, while the optimizer steps B, which receives no gradient: *neither model trains*, and nothing fails.

Two places can see it (sentence-transformers hands a loss neither the Trainer nor its model):

- where both models are known: :func:`st_hardneg.training.callbacks.check_loss_model` (called by
  :func:`st_hardneg.training.train` before the Trainer is built) and
  :class:`st_hardneg.training.callbacks.LossModelCheck` (a ``TrainerCallback``: at ``on_train_begin`` it also checks
  that the optimizer holds the Trainer's model's parameters);
- in a plain ``SentenceTransformerTrainer`` without that callback: the moment the Trainer re-points ``loss.model``,
  which :class:`ModelGuard` (a part of every st-hardneg loss) notices. That is at the first training step, after the
  optimizer was made: the warning comes one step in, and the run goes on (untrained) unless the user stops it.
  The Trainer's ``model_init`` (hyperparameter search) also re-points the loss, on purpose and before it makes the
  optimizer; there the warning is a false alarm, which its text says.

Two modules are "the same model" when one wraps the other (DDP, ``torch.compile``, Accelerate), i.e. when they
share their parameters (:func:`same_model`).
"""

from __future__ import annotations

import logging
import sys
import warnings
from collections.abc import Iterator
from typing import Any

from torch import nn

__all__ = ["ModelGuard", "loss_models", "same_model", "swapped_model_message"]

logger = logging.getLogger(__name__)


def same_model(a: Any, b: Any) -> bool:
    """Whether ``a`` and ``b`` are one model: the same object, or one a wrapper of the other (DDP, ``torch.compile``,
    Accelerate), which share their parameters (the first parameter of each is the same tensor). Modules without
    parameters are compared after unwrapping ``.module`` / ``._orig_mod``."""
    if a is b:
        return True
    if not isinstance(a, nn.Module) or not isinstance(b, nn.Module):
        return False
    first_a, first_b = next(a.parameters(), None), next(b.parameters(), None)
    if first_a is not None or first_b is not None:
        return first_a is first_b
    return _unwrap(a) is _unwrap(b)


def _unwrap(module: nn.Module) -> nn.Module:
    for _ in range(8):  # DDP(compile(model)) and the like: a few layers at most
        inner = getattr(module, "module", None) or getattr(module, "_orig_mod", None)
        if not isinstance(inner, nn.Module):
            break
        module = inner
    return module


def _is_model(module: nn.Module) -> bool:
    """Whether ``module`` is an encoder (a sentence-transformers model, a Hugging Face model or anything that
    encodes), not a loss: its own ``model`` attributes are not the trained model's."""
    from sentence_transformers.base.model import BaseModel
    from transformers import PreTrainedModel

    return isinstance(module, BaseModel | PreTrainedModel) or callable(getattr(module, "encode", None))


def loss_models(loss: Any) -> Iterator[tuple[str, nn.Module, nn.Module]]:
    """``(name, loss module, its model)`` for every loss inside ``loss`` (a module or a dict of them, e.g.
    ``MatryoshkaLoss`` and the loss it wraps) that stores a ``model``. Encoders (the model, a guide model) are not
    searched."""
    items = loss.items() if isinstance(loss, dict) else [("", loss)]
    for key, item in items:
        if not isinstance(item, nn.Module) or _is_model(item):
            continue
        stack: list[tuple[str, nn.Module]] = [(str(key), item)]
        while stack:
            path, module = stack.pop()
            model = getattr(module, "model", None)
            if isinstance(model, nn.Module):
                yield type(module).__name__ + (f" ({path})" if path else ""), module, model
            for name, child in module.named_children():
                if name == "model" or child is model or _is_model(child):
                    continue
                stack.append((f"{path}.{name}" if path else name, child))


def swapped_model_message(loss_name: str) -> str:
    """The warning of a loss re-pointed from the model it was built on to another one."""
    return (
        f"{loss_name}: loss.model was re-pointed to another model than the one the loss was built on. "
        "SentenceTransformerTrainer does this at its first training step when its model= is not the loss's model, "
        "after it made its optimizer from the loss's parameters (the first model's): the new model then gets "
        "gradients that no optimizer applies and does not train (nor does the first model). Build the loss on the "
        f"model you train: {loss_name}(model) with the model given to the Trainer. (The Trainer's model_init "
        "re-points on purpose before making its optimizer; then this warning does not apply.) Shown once per loss.")


class ModelGuard:
    """The part of every st-hardneg loss (``loss.model_guard``) that warns (``warnings`` and ``logging``, once per
    loss) when ``loss.model`` is re-pointed from the model it holds to another model that is not a wrapper of it (see
    the module docstring). The loss calls :meth:`check` from its ``__setattr__``."""

    def __init__(self) -> None:
        #: whether the loss was named already (here, or by :func:`st_hardneg.training.callbacks.check_loss_model`)
        self.warned = False

    def check(self, loss_name: str, current: Any, value: Any) -> None:
        """Warn once if ``value``, about to replace ``current`` as ``loss.model``, is another model."""
        if self.warned or not isinstance(value, nn.Module) or not isinstance(current, nn.Module):
            return
        if not same_model(current, value):
            self.warned = True
            message = swapped_model_message(loss_name)
            logger.warning(message)
            warnings.warn(message, UserWarning, stacklevel=3)


def tag_model_card(model: Any) -> None:
    """Name st-hardneg on the model card of ``model`` when a loss is built on it: the ``st-hardneg`` tag and the
    package version (``model_card_data.version["st_hardneg"]``), as sentence-transformers adds its own tag and
    version. The card data survives the Trainer's ``set_losses`` (which adds ``loss:<class>`` tags and each loss's
    ``citation``), so a plain ``SentenceTransformerTrainer`` run saves a card that names st-hardneg;
    :class:`~st_hardneg.training.callbacks.ModelCardCallback` adds the documentation links on top. A model without
    card data (a bare ``nn.Module``) is left alone."""
    card = getattr(model, "model_card_data", None)
    add_tags = getattr(card, "add_tags", None)
    if not callable(add_tags):
        return
    add_tags(["st-hardneg"])
    version = getattr(card, "version", None)
    # the package face, always loaded before its modules (no upward import for the version)
    package_version = getattr(sys.modules.get("st_hardneg"), "__version__", None)
    if isinstance(version, dict) and package_version:
        version["st_hardneg"] = str(package_version)
