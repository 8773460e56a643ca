"""GradCache for any loss that scores embeddings, built on sentence-transformers' ``CachedLossMixin``.

sentence-transformers 6.2 implements GradCache (Gao et al., 2021) once, in
``sentence_transformers.base.losses.gradcache.CachedLossMixin``: (1) embed every mini-batch without a graph, keeping
each mini-batch's RNG state; (2) compute the loss on the whole batch from those detached embeddings and back-propagate
it to them, caching their gradients; (3) in a hook on the returned loss, re-embed each mini-batch with a graph under
the replayed RNG state and back-propagate the cached gradient through it. Only one mini-batch of activations is alive
at a time, so any batch fits in the memory of a ``mini_batch_size`` batch, and the gradients are those of the full
batch (exactly, up to float summation order, when the replay reproduces the embeddings).

:class:`GradCacheEngine` is that machinery's st-hardneg side, a part a loss owns (``loss.gradcache``): the columns
embedded without gradient, the mini-batch embeddings put back together column by column for step (2), and step (1)'s
autocast replayed in step (3). :class:`~st_hardneg.losses.base.HardNegativeLoss` uses it on sentence-transformers'
``CachedLossMixin`` directly (its step (2) is its one compute template, a chunk of rows at a time);
:class:`GradCacheMixin` plugs any other loss into it: its ``calculate_loss`` calls the loss's own
``compute_loss_from_embeddings(embeddings, labels)``, so the cached and the uncached loss share one implementation. Cross-device gathering composes for free: the gather
happens inside ``compute_loss_from_embeddings``, step (2) back-propagates through it (each process receives the
gradient of its own embeddings from every process's loss), and step (3) is purely local.

Columns embedded without gradient by another module (AdCSE's momentum key encoder) are declared through
:meth:`GradCacheMixin.frozen_column_model` (a loss of st-hardneg: ``frozen_columns``); they are embedded once, mini-batch by mini-batch under ``no_grad``, and
only the other columns go through the cache.

A loss that cannot use the mixin directly wraps itself in :class:`GradCached`::

    loss = GradCached(MultipleNegativesRankingLoss(model), mini_batch_size=32)
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any, cast

import torch
from sentence_transformers.base.losses.gradcache import (
    CachedLossMixin,
    _create_minibatch,
    _minibatch_ranges,
    _validate_mini_batch_num_tokens,
    has_static_embedding_input,
)
from torch import Tensor, nn

from st_hardneg import validation
from st_hardneg.losses.batch import CallContext

__all__ = ["GradCacheEngine", "GradCacheMixin", "GradCached", "check_cacheable_model"]


def check_cacheable_model(model: Any, loss_name: str) -> None:
    """Raise ``ValueError`` if ``model``'s inputs cannot be split into mini-batches (a StaticEmbedding model).
    A model that is not a module sequence (no ``model[0]``) is not a StaticEmbedding model and passes."""
    try:
        static = has_static_embedding_input(model)
    except (TypeError, IndexError, KeyError, AttributeError):
        static = False
    if static:
        raise ValueError(
            f"{loss_name} with mini_batch_size / mini_batch_num_tokens needs inputs that can be split along the batch "
            "dimension; a StaticEmbedding model's cannot. Leave mini_batch_size=None for this model."
        )


def embed_with_replayed_autocast(embed: Callable[..., tuple[Tensor, Any]], sentence_feature: dict[str, Tensor],
                                 begin: int, end: int, with_grad: bool, copy_random_state: bool,
                                 random_state: Any = None) -> tuple[Tensor, Any]:
    """sentence-transformers' ``embed_minibatch`` (``embed``), with step (1)'s autocast state replayed in step (3),
    as its RNG state is: step (3) runs inside ``backward()``, where a ``torch.autocast`` around the loss's forward is
    no longer active, and would re-embed in float32 what step (1) embedded in bf16 (slower, and not the embeddings
    whose gradients were cached). The state rides on the mini-batch's ``RandContext``."""
    replay = getattr(random_state, "autocast", None)
    with torch.autocast(*replay) if replay is not None else contextlib.nullcontext():
        reps, state = embed(sentence_feature, begin, end, with_grad, copy_random_state, random_state)
    if state is not None and torch.is_autocast_enabled(reps.device.type):
        device = reps.device.type
        state.autocast = (device, torch.get_autocast_dtype(device), True,  # type: ignore[attr-defined]
                          torch.is_autocast_cache_enabled())
    return reps, state


class GradCacheEngine:
    """GradCache's st-hardneg side, a part a loss owns, with no state: one cached call's columns split
    (:meth:`embed_frozen`: the frozen columns embedded without gradient into the call's context, the others left for
    sentence-transformers' ``forward_cached``) and step (2)'s columns put back together (:meth:`columns`). The loss
    keeps ``mini_batch_size`` / ``mini_batch_num_tokens`` (the names sentence-transformers' ``CachedLossMixin``
    reads) and gives them here with each call."""

    def embed_frozen(self, name: str, sentence_features: list[dict[str, Tensor]], frozen: dict[int, nn.Module],
                     context: CallContext, mini_batch_size: int | None, mini_batch_num_tokens: int | None,
                     ) -> tuple[CallContext, list[dict[str, Tensor]]]:
        """The cached call of loss ``name``: ``context`` with the columns ``frozen`` names embedded by their module
        without gradient (``frozen_columns``), and the other columns' features, for ``forward_cached``.

        Raises:
            RuntimeError: neither ``mini_batch_size`` nor ``mini_batch_num_tokens`` is set.
            ValueError: a bad mini-batch option, or every column is frozen.
        """
        if mini_batch_size is None and mini_batch_num_tokens is None:
            raise RuntimeError(f"{name}: cached_forward needs mini_batch_size or mini_batch_num_tokens")
        validation.check_optional_count(mini_batch_size, "mini_batch_size")
        _validate_mini_batch_num_tokens(mini_batch_num_tokens)
        embedded = {column: embed_without_grad(module, sentence_features[column], mini_batch_size,
                                               mini_batch_num_tokens)
                    for column, module in frozen.items()}
        cached = [features for column, features in enumerate(sentence_features) if column not in embedded]
        if not cached:
            raise ValueError(f"{name}: every input column is frozen; nothing to train")
        return replace(context, frozen_columns=embedded), cached

    def columns(self, reps: list[list[Tensor]], context: CallContext | None) -> list[Tensor]:
        """Step (2)'s embeddings, one per input column in column order: the cached mini-batches concatenated, the
        frozen columns of the call's ``context`` in their places."""
        cached = [torch.cat(mini_batches) for mini_batches in reps]
        frozen = context.frozen_columns if context is not None else {}
        if not frozen:
            return cached
        it = iter(cached)
        return [frozen[column] if column in frozen else next(it) for column in range(len(cached) + len(frozen))]


def embed_without_grad(module: nn.Module, features: dict[str, Tensor], mini_batch_size: int | None,
                       mini_batch_num_tokens: int | None) -> Tensor:
    """``module``'s embeddings of one input column without gradient, in GradCache's mini-batches."""
    ranges = _minibatch_ranges(features, mini_batch_size, mini_batch_num_tokens)  # type: ignore[arg-type]
    with torch.no_grad():
        parts = [module(_create_minibatch(features, begin, end))["sentence_embedding"] for begin, end in ranges]
    return torch.cat(parts).detach()


class GradCacheMixin(CachedLossMixin):
    """GradCache for a loss ``nn.Module`` with a ``model`` and ``compute_loss_from_embeddings(embeddings, labels)``.

    The loss sets ``self.mini_batch_size`` (and optionally ``self.mini_batch_num_tokens``) and calls
    :meth:`cached_forward` from its ``forward`` when :attr:`uses_gradient_cache` is true. Put the mixin before
    ``nn.Module`` in the bases. This is GradCache's contract written once: the st-hardneg losses
    (:class:`~st_hardneg.losses.base.HardNegativeLoss`) take it from here too, with a step (2) of their own (their
    compute template, a chunk of rows at a time).

    ``compute_loss_from_embeddings`` receives detached leaf embeddings (float as the model returns them), one per
    input column, in column order, with the full batch; it must return the scalar loss of the batch. It runs once
    per forward (step 2), so any side effect there (statistics, random draws) happens once per batch, as in the
    uncached forward. With ``gather_across_devices`` the gather stays inside it.
    """

    # optional here (ST declares int, but reads it only when mini_batch_num_tokens is None)
    mini_batch_size: int | None = None  # type: ignore[assignment]
    mini_batch_num_tokens: int | None = None

    @property
    def uses_gradient_cache(self) -> bool:  # type: ignore[override]  # per instance: caching is optional here
        return self.mini_batch_size is not None or self.mini_batch_num_tokens is not None

    @property
    def _engine(self) -> GradCacheEngine:
        """The loss's GradCache part (``loss.gradcache``), made at its first use if the loss has none."""
        engine = vars(self).get("gradcache")
        if engine is None:
            engine = vars(self)["gradcache"] = GradCacheEngine()
        return engine  # type: ignore[no-any-return]

    def frozen_column_model(self, column: int) -> nn.Module | None:
        """The module that embeds input column ``column`` without gradient, or ``None`` (default) for a column
        embedded by ``self.model`` and cached with gradient."""
        return None

    def frozen_columns(self, sentence_features: list[dict[str, Tensor]]) -> dict[int, nn.Module]:
        """``{column: module}`` of the columns of this batch embedded without gradient (default: the columns for
        which :meth:`frozen_column_model` names a module)."""
        frozen = {column: self.frozen_column_model(column) for column in range(len(sentence_features))}
        return {column: module for column, module in frozen.items() if module is not None}

    def compute_loss_from_embeddings(self, embeddings: list[Tensor], labels: Tensor | None) -> Tensor:
        raise NotImplementedError

    def cached_forward(self, sentence_features: Iterable[dict[str, Tensor]], labels: Tensor | None,
                       context: CallContext | None = None) -> Tensor:
        """The GradCache forward pass: returns the (detached, hooked) loss; ``loss.backward()`` fills the gradients.

        ``context``: what the call knows besides the embeddings (:class:`~st_hardneg.losses.batch.CallContext`;
        ``None``: an empty one); the columns of :meth:`frozen_columns`, embedded without gradient, join it. Every
        ``calculate_loss`` of this call computes with it (``MatryoshkaLoss`` calls it once per dimension):
        sentence-transformers' ``forward_cached`` calls ``calculate_loss(reps, labels)``, so the loss holds the
        context while the call runs, and drops it when the call returns or raises."""
        sentence_features = list(sentence_features)
        context, cached = self._engine.embed_frozen(
            type(self).__name__, sentence_features, self.frozen_columns(sentence_features),
            context if context is not None else CallContext(), self.mini_batch_size, self.mini_batch_num_tokens)
        vars(self)["_call_context"] = context
        try:
            # ST's range splitter reads mini_batch_size only when mini_batch_num_tokens is None.
            return self.forward_cached(cached, labels)
        finally:
            vars(self).pop("_call_context", None)

    def _running_context(self) -> CallContext | None:
        """The context of the cached call running now (:meth:`cached_forward`), ``None`` between calls."""
        return cast("CallContext | None", vars(self).get("_call_context"))

    def embed_minibatch(self, sentence_feature: dict[str, Tensor], begin: int, end: int, with_grad: bool,
                        copy_random_state: bool, random_state: Any = None) -> tuple[Tensor, Any]:
        """sentence-transformers' ``embed_minibatch`` with step (1)'s autocast replayed in step (3)
        (:func:`embed_with_replayed_autocast`)."""
        return embed_with_replayed_autocast(super().embed_minibatch, sentence_feature, begin, end, with_grad,
                                            copy_random_state, random_state)

    def calculate_loss(
        self, reps: list[list[Tensor]], labels: Tensor | None = None, *, with_backward: bool = False
    ) -> Tensor:
        """Step (2) of ``CachedLossMixin``: the loss of the whole batch from the per-mini-batch embeddings, through
        ``compute_loss_from_embeddings``; with ``with_backward``, back-propagated to the embeddings and detached."""
        loss = self.compute_loss_from_embeddings(self._engine.columns(reps, self._running_context()), labels)
        if loss.dim() != 0:
            raise ValueError(f"{type(self).__name__}.compute_loss_from_embeddings must return a scalar loss")
        if with_backward:
            loss.backward()
            loss = loss.detach()
        return loss


class GradCached(GradCacheMixin, nn.Module):
    """Wrap any loss with ``model`` and ``compute_loss_from_embeddings(embeddings, labels)`` (e.g.
    sentence-transformers' ``MultipleNegativesRankingLoss``) into its GradCache version.

    Args:
        loss: the loss to cache; its hyperparameters (``gather_across_devices`` included) keep their meaning.
        mini_batch_size: sequences per mini-batch in the embedding passes.
        mini_batch_num_tokens: alternatively, a budget of non-padding tokens per mini-batch.
        frozen_columns: ``{column: module}`` for columns embedded without gradient by another module.

    Example::

        loss = GradCached(MultipleNegativesRankingLoss(model, gather_across_devices=True), mini_batch_size=32)
    """

    def __init__(
        self,
        loss: nn.Module,
        mini_batch_size: int | None = 32,
        mini_batch_num_tokens: int | None = None,
        frozen_columns: dict[int, nn.Module] | None = None,
    ) -> None:
        super().__init__()
        if not callable(getattr(loss, "compute_loss_from_embeddings", None)) or getattr(loss, "model", None) is None:
            raise ValueError("GradCached needs a loss with a `model` and a `compute_loss_from_embeddings` method")
        self.loss = loss
        self.mini_batch_size = validation.check_optional_count(mini_batch_size, "mini_batch_size")
        _validate_mini_batch_num_tokens(mini_batch_num_tokens)
        self.mini_batch_num_tokens = mini_batch_num_tokens
        if not self.uses_gradient_cache:
            raise ValueError("GradCached needs mini_batch_size or mini_batch_num_tokens")
        check_cacheable_model(loss.model, type(loss).__name__)
        self._frozen_columns = dict(frozen_columns or {})

    @property
    def model(self) -> nn.Module:
        return cast(nn.Module, self.loss.model)

    def __setattr__(self, name: str, value: Any) -> None:
        # The trainer re-points `loss.model`; nn.Module.__setattr__ would register the module here instead.
        if name == "model" and isinstance(getattr(self, "loss", None), nn.Module):
            setattr(self.loss, name, value)
        else:
            super().__setattr__(name, value)

    def frozen_column_model(self, column: int) -> nn.Module | None:
        return self._frozen_columns.get(column)

    def compute_loss_from_embeddings(self, embeddings: list[Tensor], labels: Tensor | None) -> Tensor:
        return cast(Any, self.loss).compute_loss_from_embeddings(embeddings, labels)

    def forward(self, sentence_features: Iterable[dict[str, Tensor]], labels: Tensor | None) -> Tensor:
        return self.cached_forward(sentence_features, labels)

    def get_config_dict(self) -> dict[str, Any]:
        config = dict(cast(Any, self.loss).get_config_dict()) if hasattr(self.loss, "get_config_dict") else {}
        config.update(mini_batch_size=self.mini_batch_size, mini_batch_num_tokens=self.mini_batch_num_tokens)
        return config
