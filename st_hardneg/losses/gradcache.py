"""GradCache for any loss that scores embeddings, built on sentence-transformers' ``CachedLossMixin``.

sentence-transformers 6.2 implements GradCache (Gao et al., 2021) once, in
``sentence_transformers.base.losses.gradcache.CachedLossMixin``: (1) embed every mini-batch without a graph, keeping
each mini-batch's RNG state; (2) compute the loss on the whole batch from those detached embeddings and back-propagate
it to them, caching their gradients; (3) in a hook on the returned loss, re-embed each mini-batch with a graph under
the replayed RNG state and back-propagate the cached gradient through it. Only one mini-batch of activations is alive
at a time, so any batch fits in the memory of a ``mini_batch_size`` batch, and the gradients are those of the full
batch (exactly, up to float summation order, when the replay reproduces the embeddings).

:class:`GradCacheMixin` plugs a loss into that machinery: the mixin's ``calculate_loss`` concatenates the
mini-batch embeddings column by column and calls the loss's own ``compute_loss_from_embeddings(embeddings, labels)``,
so the cached and the uncached loss share one implementation. Cross-device gathering composes for free: the gather
happens inside ``compute_loss_from_embeddings``, step (2) back-propagates through it (each process receives the
gradient of its own embeddings from every process's loss), and step (3) is purely local.

Columns embedded without gradient by another module (AdCSE's momentum key encoder) are declared through
:meth:`GradCacheMixin.frozen_column_model`; they are embedded once, mini-batch by mini-batch under ``no_grad``, and
only the other columns go through the cache.

A loss that cannot use the mixin directly wraps itself in :class:`GradCached`::

    loss = GradCached(MultipleNegativesRankingLoss(model), mini_batch_size=32)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
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

from st_hardneg import functional as fn
from st_hardneg import validation
from st_hardneg.losses import distributed as dist
from st_hardneg.losses.batch import Batch
from st_hardneg.losses.blocks import UnusableMixin, combine_chunk_stats
from st_hardneg.losses.prepare import PrepareMixin

__all__ = ["ChunkedLossMixin", "GradCacheMixin", "GradCached", "check_cacheable_model"]


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


class GradCacheMixin(CachedLossMixin):
    """GradCache for a loss ``nn.Module`` with a ``model`` and ``compute_loss_from_embeddings(embeddings, labels)``.

    The loss sets ``self.mini_batch_size`` (and optionally ``self.mini_batch_num_tokens``) and calls
    :meth:`cached_forward` from its ``forward`` when :attr:`uses_gradient_cache` is true. Put the mixin before
    ``nn.Module`` in the bases.

    ``compute_loss_from_embeddings`` receives detached leaf embeddings (float as the model returns them), one per
    input column, in column order, with the full batch; it must return the scalar loss of the batch. It runs once
    per forward (step 2), so any side effect there (statistics, the adversary gradient of AdCSE, random draws)
    happens once per batch, as in the uncached forward. With ``gather_across_devices`` the gather stays inside it.
    """

    # optional here (ST declares int, but reads it only when mini_batch_num_tokens is None)
    mini_batch_size: int | None = None  # type: ignore[assignment]
    mini_batch_num_tokens: int | None = None
    _gradcache_frozen: tuple[int, dict[int, Tensor]] | None = None

    @property
    def uses_gradient_cache(self) -> bool:  # type: ignore[override]  # per instance: caching is optional here
        return self.mini_batch_size is not None or self.mini_batch_num_tokens is not None

    def frozen_column_model(self, column: int) -> nn.Module | None:
        """The module that embeds input column ``column`` without gradient, or ``None`` (default) for a column
        embedded by ``self.model`` and cached with gradient. AdCSE with an untied key encoder returns the key encoder
        for every column but the first."""
        return None

    def frozen_columns(self, sentence_features: list[dict[str, Tensor]]) -> dict[int, nn.Module]:
        """``{column: module}`` of the columns of this batch embedded without gradient (default: the columns for
        which :meth:`frozen_column_model` names a module). A loss whose choice depends on the features (AdCSE on a
        ``Router`` model: the columns on the anchors' route) overrides this."""
        frozen = {column: self.frozen_column_model(column) for column in range(len(sentence_features))}
        return {column: module for column, module in frozen.items() if module is not None}

    def compute_loss_from_embeddings(self, embeddings: list[Tensor], labels: Tensor | None) -> Tensor:
        raise NotImplementedError

    def cached_forward(self, sentence_features: Iterable[dict[str, Tensor]], labels: Tensor | None) -> Tensor:
        """The GradCache forward pass: returns the (detached, hooked) loss; ``loss.backward()`` fills the gradients."""
        if not self.uses_gradient_cache:
            raise RuntimeError(f"{type(self).__name__}: cached_forward needs mini_batch_size or mini_batch_num_tokens")
        validation.check_optional_count(self.mini_batch_size, "mini_batch_size")
        _validate_mini_batch_num_tokens(self.mini_batch_num_tokens)
        sentence_features = list(sentence_features)
        frozen = {column: self._embed_without_grad(module, sentence_features[column])
                  for column, module in self.frozen_columns(sentence_features).items()}
        cached = [features for column, features in enumerate(sentence_features) if column not in frozen]
        if not cached:
            raise ValueError(f"{type(self).__name__}: every input column is frozen; nothing to train")
        self._gradcache_frozen = (len(sentence_features), frozen)
        try:
            # ST's range splitter reads mini_batch_size only when mini_batch_num_tokens is None.
            return self.forward_cached(cached, labels)
        finally:
            self._gradcache_frozen = None

    def embed_minibatch(self, sentence_feature: dict[str, Tensor], begin: int, end: int, with_grad: bool,
                        copy_random_state: bool, random_state: Any = None) -> tuple[Tensor, Any]:
        """sentence-transformers' ``embed_minibatch``, with step (1)'s autocast state replayed in step (3), as its RNG
        state is: step (3) runs inside ``backward()``, where a ``torch.autocast`` around the loss's forward is no
        longer active, and would re-embed in float32 what step (1) embedded in bf16 (slower, and not the
        embeddings whose gradients were cached). The state rides on the mini-batch's ``RandContext``."""
        replay = getattr(random_state, "autocast", None)
        with torch.autocast(*replay) if replay is not None else contextlib.nullcontext():
            reps, state = super().embed_minibatch(sentence_feature, begin, end, with_grad, copy_random_state,
                                                  random_state)
        if state is not None and torch.is_autocast_enabled(reps.device.type):
            device = reps.device.type
            state.autocast = (device, torch.get_autocast_dtype(device), True,  # type: ignore[attr-defined]
                              torch.is_autocast_cache_enabled())
        return reps, state

    def _embed_without_grad(self, module: nn.Module, features: dict[str, Tensor]) -> Tensor:
        ranges = _minibatch_ranges(features, self.mini_batch_size, self.mini_batch_num_tokens)  # type: ignore[arg-type]
        with torch.no_grad():
            parts = [module(_create_minibatch(features, begin, end))["sentence_embedding"] for begin, end in ranges]
        return torch.cat(parts).detach()

    def calculate_loss(
        self, reps: list[list[Tensor]], labels: Tensor | None = None, *, with_backward: bool = False
    ) -> Tensor:
        """Step (2) of ``CachedLossMixin``: the loss of the whole batch from the per-mini-batch embeddings, through
        ``compute_loss_from_embeddings``; with ``with_backward``, back-propagated to the embeddings and detached."""
        cached = [torch.cat(mini_batches) for mini_batches in reps]
        embeddings = cached
        if self._gradcache_frozen is not None:
            num_columns, frozen = self._gradcache_frozen
            it = iter(cached)
            embeddings = [frozen[column] if column in frozen else next(it) for column in range(num_columns)]
        if getattr(self, "supports_row_chunks", False):  # the loss side in chunks of anchor rows too
            return cast(Any, self).chunked_loss(embeddings, labels, with_backward=with_backward)
        loss = self.compute_loss_from_embeddings(embeddings, labels)
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


class ChunkedLossMixin(PrepareMixin, UnusableMixin, GradCacheMixin):
    """The rows hook of :class:`~st_hardneg.losses.base.HardNegativeLoss` (:meth:`window_rows`; the batch's other
    hooks are :class:`~st_hardneg.losses.prepare.PrepareMixin`'s) and GradCache's loss side a chunk of anchor rows
    at a time (:meth:`chunked_loss`)."""

    def window_rows(self, batch: Batch) -> Tensor:
        """The (R,) per-row losses of the anchor rows of ``batch`` (:attr:`Batch.rows`) against all its candidates.
        A loss that implements it computes its rows a chunk of anchors at a time under GradCache
        (:meth:`chunked_loss`); whatever it chooses per row (partners, hardest negatives, top-k, random draws) must
        not depend on which other rows share the chunk."""
        raise NotImplementedError

    @property
    def supports_row_chunks(self) -> bool:
        """Whether the loss implements :meth:`window_rows` (then GradCache computes it in chunks of anchors)."""
        return type(self).window_rows is not ChunkedLossMixin.window_rows

    @property
    def loss_chunk_size(self) -> int:
        """Anchor rows per chunk of :meth:`chunked_loss`: ``mini_batch_size`` (as in CachedMNRL), or 32 with only
        ``mini_batch_num_tokens``."""
        return self.mini_batch_size or 32

    def chunked_loss(self, embeddings: list[Tensor], labels: Tensor | None, with_backward: bool = False) -> Tensor:
        """The batch's loss computed a chunk of :attr:`loss_chunk_size` anchor rows at a time, as
        ``CachedMultipleNegativesRankingLoss`` does: each chunk's rows (against every candidate of the global batch)
        are built, back-propagated to the normalised embeddings and freed before the next chunk, so the loss side
        holds O(chunk × candidates) at a time, never the (N, C) matrices. With ``with_backward`` the gradient then
        flows once through the normalisation (and the gathering) into ``embeddings``; the returned loss is detached.
        Equal to :meth:`compute_loss_from_embeddings` (loss, gradients, diagnostics, warnings and errors), up to
        float summation order."""
        from dataclasses import replace

        self.check_labels(labels)
        with fn.autocast_disabled(embeddings):
            try:
                batch = self.prepare_columns(embeddings, labels)
            finally:
                self._side_inputs = None
            try:
                batch = self.begin_batch(batch)
            except BaseException:
                self.close_batch()
                raise
            fields = ("anchors", "positives", "negatives", "raw_anchors", "raw_positives", "raw_negatives")
            graph: list[tuple[Tensor, Tensor]] = []  # (tensor with a graph, its leaf copy)
            leaves: dict[str, Tensor] = {}
            for name in fields:
                value = getattr(batch, name)
                if value is not None and with_backward and value.requires_grad:
                    leaf = value.detach().requires_grad_(True)
                    graph.append((value, leaf))
                    leaves[name] = leaf
                elif value is not None:
                    leaves[name] = value.detach() if with_backward else value
            leaf_batch = replace(batch, **cast(dict[str, Any], leaves))
            start, stop = self.own_row_range(batch)
            total = torch.zeros((), dtype=batch.anchors.dtype, device=batch.device)
            pieces: list[tuple[int, dict[str, Tensor]]] = []
            state = batch.state  # shared by leaf_batch and every window cut from it
            state.chunk_tallies = []
            try:
                for begin in range(start, stop, self.loss_chunk_size):
                    end = min(begin + self.loss_chunk_size, stop)
                    rows = self.window_rows(self.window(leaf_batch, begin, end))
                    usable, state.usable = state.usable, None
                    chunk = (rows * usable).sum() if usable is not None else rows.sum()
                    if with_backward and chunk.requires_grad:
                        chunk.backward()
                    total = total + chunk.detach()
                    pieces.append((end - begin, dict(self._last_stats)))
                tallies = state.chunk_tallies
                self.end_batch(leaf_batch)
            finally:
                state.chunk_tallies = None
                self.close_batch()
            self._last_stats = combine_chunk_stats(pieces)
            tally = self._global_tally(state, sum(tallies[1:], tallies[0])) if tallies else None
            if tally is not None:
                self._judge_unusable(tally, state)  # raises on a batch without a usable row
            local_usable = (stop - start) - (sum(t.unusable for t in tallies) if tallies else 0)
            if state.local_rows is not None:
                world = state.local_rows[1] // (stop - start)
                count = dist.sum_across(torch.tensor(float(local_usable), dtype=total.dtype, device=batch.device))
                factor = world / count.clamp_min(1)
            else:
                factor = torch.tensor(1.0 / max(local_usable, 1), dtype=total.dtype, device=batch.device)
            loss = total * factor
            if with_backward and graph:
                pairs = [(tensor, leaf.grad.mul_(factor)) for tensor, leaf in graph if leaf.grad is not None]
                if pairs:
                    torch.autograd.backward([t for t, _ in pairs], [g for _, g in pairs])
            return loss.detach() if with_backward else loss

