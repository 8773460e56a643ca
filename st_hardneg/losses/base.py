"""What every st-hardneg loss shares: the shared options, the sentence-transformers forward, the parts a loss owns and
the one compute template that calls them; and InfoNCE itself, the loss with no paper's columns.

A loss is one ``nn.Module`` that owns its parts, calls each of them from its template and passes each what it needs
(:class:`HardNegativeLoss`); the parts return values and never call one another:

- ``preparer`` (:class:`~st_hardneg.losses.prepare.BatchPreparer`): the columns checked and normalised, gathered,
  cut into windows of rows with their false-negative masks and known relevance;
- ``ranking`` (:class:`~st_hardneg.losses.blocks.Ranking`): sentence-transformers' blocks, the per-row losses with
  the unusable-row rule, and the reduction;
- ``queues`` (:class:`~st_hardneg.losses.queue.QueueBanks`): the cross-batch queue, read per window and fed once per
  batch (only when the loss has a queue);
- ``gradcache`` (:class:`~st_hardneg.losses.gradcache.GradCacheEngine`): the cached forward of
  :class:`~st_hardneg.losses.gradcache.GradCacheMixin`, GradCache's contract written once;
- ``model_guard`` (:class:`~st_hardneg.losses.model_guard.ModelGuard`): warns when the Trainer re-points
  ``loss.model``.

One batch's path: ``forward`` builds the call's context (:class:`~st_hardneg.losses.batch.CallContext`) and calls
:meth:`HardNegativeLoss.compute` (GradCache's step (2), ``calculate_loss``, with the same context), the one
template: ``preparer.prepare`` → the paper's ``begin_batch`` → per window of rows (one window uncached, a chunk of
rows at a time under GradCache) ``preparer.window`` → :meth:`HardNegativeLoss.window_rows`, the template's step:
``ranking.blocks`` → (a queue) ``queues.read`` → the paper's ``paper_columns`` → the window's statistics →
(a queue) ``queues.join`` → ``ranking.rows`` → ``ranking.usable_sum``, the running sum; after the windows (a queue)
``queues.stage``, ``ranking.judge``, the paper's ``end_batch`` and ``ranking.mean``, with ``close_batch`` in
``finally``. The batch's statistics end in the loss's one per-batch record, ``_last_stats``
(:attr:`HardNegativeLoss.diagnostics`).
"""

from __future__ import annotations

import functools
import logging
import operator
import warnings
from collections.abc import Callable, Iterable
from dataclasses import fields, replace
from typing import Any, Unpack, cast

import torch
from sentence_transformers import SentenceTransformer
from sentence_transformers.base.losses.merged_forward import embed_columns
from torch import Tensor, nn

from st_hardneg import functional as fn
from st_hardneg import validation
from st_hardneg.functional import ranking as fr
from st_hardneg.losses import columns, false_negatives
from st_hardneg.losses import distributed as dist
from st_hardneg.losses.batch import Batch, CallContext, SideInputs, WindowRecord
from st_hardneg.losses.blocks import Ranking, combine_chunk_stats, unusable_stats
from st_hardneg.losses.gradcache import (
    GradCacheEngine,
    GradCacheMixin,
    check_cacheable_model,
    embed_without_grad,
)
from st_hardneg.losses.model_guard import ModelGuard, tag_model_card
from st_hardneg.losses.options import (
    LossOptions,
    QueueOptions,
    SharedOptions,
    constructor_signature,
    option_attributes,
    owned_error,
)
from st_hardneg.losses.prepare import BatchPreparer
from st_hardneg.losses.queue import QueueBanks, QueueRead
from st_hardneg.losses.relevance import KnownPositives

__all__ = ["HardNegativeLoss", "LossOptions", "QueueOptions", "SharedOptions"]

logger = logging.getLogger(__name__)

#: the fields of a :class:`~st_hardneg.losses.batch.Batch` that carry the embeddings (the leaves of a chunked batch)
_EMBEDDING_FIELDS = ("anchors", "positives", "negatives", "raw_anchors", "raw_positives", "raw_negatives")


def _embed_column(module: nn.Module, features: dict[str, Tensor]) -> Tensor:
    return module(features)["sentence_embedding"]  # type: ignore[no-any-return]


class HardNegativeLoss(GradCacheMixin, nn.Module):
    """Base class of the st-hardneg losses, and itself InfoNCE: ``HardNegativeLoss(model)`` is sentence-transformers'
    ``MultipleNegativesRankingLoss`` (loss and gradients, every ``directions``, ``partition_mode``, ``hardness_mode``
    and ``similarity_fct``) with every shared feature of the papers' losses: the queue, GradCache, gathering,
    false-negative control (``mask_duplicates=False`` for MNRL's exact value on data with duplicates) and Router
    models. A paper's loss adds its columns to the same template.

    Subclasses take their paper's hyperparameters and pass the shared options (:class:`LossOptions`) on, and
    implement :meth:`paper_columns` (their equation as columns: blocks in, blocks out; :meth:`compute` is the one
    template that calls it, once per window) as::

        def __init__(self, model, *, lam=0.2, **options: Unpack[LossOptions]):
            super().__init__(model, **options)
            self.lam = validation.check_unit_interval(lam, "lam")

        def paper_columns(self, batch, blocks, queue):      # a window's rows, ST's blocks with their masks
            q2d = blocks["query_to_doc"]
            ...                                              # the paper's own columns
            return {**blocks, "query_to_doc": q2d.with_columns(similarity, exclude)}

        def paper_config(self):
            return {"lam": self.lam}                         # get_config_dict() adds the shared options

    Args: the shared keyword options of every loss (sentence-transformers' names, defaults and meanings;
    false-negative control, ``known_positives``, the queue, gathering, GradCache), documented once:
    :class:`~st_hardneg.losses.options.LossOptions`. The rules shared by every loss (unusable rows, counts that
    cannot be met) are stated there too. They are checked as one value, kept as ``loss.options``
    (:class:`~st_hardneg.losses.options.SharedOptions`; the attributes of the same names read it); what needs the
    model or the guide is checked here.
    """

    #: smallest batch the loss's equation computes: InfoNCE computes a batch of one pair as sentence-transformers'
    #: MultipleNegativesRankingLoss does (its positive, and any explicit negatives, its only candidates); a paper
    #: whose equation needs another row (in-batch mixing needs a partner) raises it, and a smaller batch (the last
    #: batch of an epoch) is skipped with one warning per loss (:meth:`compute`)
    min_batch_size: int = 1
    #: whether the loss reads labels (the st-hardneg losses do not; a labelled dataset triggers a warning)
    uses_labels: bool = False
    #: whether the loss has a hardest-negative choice that can take queued rows (``queue_as_pool``)
    chooses_from_queue_pool: bool = False
    #: why a loss with such a choice still refuses ``queue_as_pool`` (None: it has no such choice)
    queue_pool_refusal: str | None = None
    #: set in __dict__ by __init__ (kept out of the module tree)
    guide: SentenceTransformer | None
    # optional here (sentence-transformers' CachedLossMixin declares int, but reads it only when
    # mini_batch_num_tokens is None)
    mini_batch_size: int | None  # type: ignore[assignment]

    def __init__(self, model: SentenceTransformer, guide: SentenceTransformer | None = None,
                 **options: Unpack[LossOptions]) -> None:
        name = type(self).__name__
        validation.check_loss_arguments(name, model, guide,
                                        [key for key in options if key not in LossOptions.__annotations__])
        shared = SharedOptions.from_keywords(name, guided=guide is not None, **options)
        super().__init__()
        self.model_guard = ModelGuard()
        self.model = model
        #: the checked shared options (:class:`~st_hardneg.losses.options.SharedOptions`; the attributes of the same
        #: names read them)
        self.options = shared
        self.similarity_fct_name = cast(str, shared.similarity_fct)
        HardNegativeLoss.check_options(self, shared)  # the paper's own rules: its constructor, after its arguments
        # sentence-transformers' CachedLossMixin reads (and a caller may set) these two
        self.mini_batch_size, self.mini_batch_num_tokens = shared.mini_batch_size, shared.mini_batch_num_tokens
        if self.uses_gradient_cache:
            if model is None:
                raise ValueError(f"{name}: mini_batch_size / mini_batch_num_tokens need a model to embed "
                                 "the mini-batches, got model=None")
            check_cacheable_model(model, name)
        # false-negative control (the mask: st_hardneg.losses.false_negatives)
        self.known_positives = KnownPositives.for_loss(name, shared.known_positives, model)
        self._must_retokenize = validation.check_guide(guide, model) if guide is not None else False
        # kept out of the module tree (as AdCSE's key encoder): not trained, not in state_dict(), not in the optimizer
        vars(self)["guide"] = guide
        self._generator: torch.Generator | None = None
        # set_false_negative_inputs' side inputs for the next compute_loss_from_embeddings (dropped when it runs;
        # a cached forward's context lives on the loss only while the call runs: GradCacheMixin.cached_forward)
        vars(self).update(_given_inputs=None)
        #: the statistics of the last batch (:attr:`diagnostics`): the one attribute a batch rebinds
        self._last_stats: dict[str, Tensor] = {}
        self.embedding_dimension = columns.model_embedding_dimension(model)
        tag_model_card(model)
        #: the parts (see the module docstring)
        rule = _false_negative_rule(shared, self.known_positives)  # one rule, given to the parts that mask
        self.preparer = BatchPreparer(name, blocks=self.blocks, rule=rule,
                                      gather_across_devices=shared.gather_across_devices, uses_labels=self.uses_labels)
        self.queues = QueueBanks(
            name, model, guide, shared.queue, directions=shared.directions,
            dot=self.similarity_fct_name == "dot_score", rule=rule, chooses_from_pool=self.chooses_from_queue_pool,
            pool_refusal=self.queue_pool_refusal, own_key_encoder=self.queues_own_key_encoder_rows())
        # the banks are the loss's child modules (stateful parts: the training callbacks find them among its modules)
        self.queue, self.anchor_queue = self.queues.queue, self.queues.anchor_queue
        self.ranking = self._ranking()
        self.gradcache = GradCacheEngine()
        vars(self)["_built"] = True  # from here on an option is assigned through _apply_options

    def _ranking(self) -> Ranking:
        """The ranking part, from the loss's current options."""
        options = self.options
        return Ranking(
            type(self).__name__, blocks=self.blocks, dot=self.similarity_fct_name == "dot_score",
            temperature=options.temperature, partition_mode=options.partition_mode,
            hardness_mode=options.hardness_mode, hardness_strength=options.hardness_strength,
            known_positives=self.known_positives is not None)

    def __setattr__(self, name: str, value: Any) -> None:
        if vars(self).get("_built"):
            if name in _ASSIGNABLE_OPTIONS:  # as sentence-transformers' losses keep them: checked, then applied
                try:
                    options = _replaced(self.options, name, value)
                except ValueError as error:  # a rule between the options: named after the loss
                    raise owned_error(error, type(self).__name__) from None
                self._apply_options(options)
                return
            if name == "options":
                self._apply_options(value)
                return
            if name == "known_positives":
                self._apply_options(replace(self.options, known_positives=value))
                return
            if name in _FIXED_OPTIONS or (name == "guide" and value is not self.guide):
                why = ("the guide decides the margin and the contrast blocks" if name in ("guide", "guided") else
                       "the queue's banks hold the queued rows and their state")
                keyword = {"guided": "guide", "queue": "queue_size", "queue_options": "queue_size",
                           "anchor_queue": "queue_anchors"}.get(name, name)
                raise AttributeError(f"{type(self).__name__}.{name} is fixed when the loss is built ({why}); build "
                                     f"a new loss with {keyword}=... instead")
        if name == "model" and "model_guard" in self.__dict__:
            self.model_guard.check(type(self).__name__, self.__dict__.get("_modules", {}).get("model"), value)
        super().__setattr__(name, value)

    def _apply_options(self, options: SharedOptions) -> None:
        """Make ``options`` the loss's (``loss.options = ...``, or one option assigned): checked as the constructor
        checks them (:meth:`check_options`), then given to the parts, so that the next batch computes with them.

        Raises:
            TypeError: ``options`` is not a :class:`SharedOptions`.
            AttributeError: it changes what is fixed when the loss is built: the queue's options, the guide, or
                (with a queue) the similarity function of the queued rows.
            ValueError: a value or a rule the constructor refuses, with its message.
        """
        name = type(self).__name__
        if not isinstance(options, SharedOptions):
            raise TypeError(f"{name}.options must be a SharedOptions (e.g. dataclasses.replace(loss.options, "
                            f"temperature=0.1)), got {type(options).__name__}")
        old = self.options
        if options.queue != old.queue:
            raise AttributeError(f"{name}: the queue's options are fixed when the loss is built (its banks hold the "
                                 "queued rows and their state); build a new loss with its queue_* keywords instead")
        if options.guided != old.guided:
            raise AttributeError(f"{name}: guided follows the guide model given to the constructor; build a new loss "
                                 "with guide=... instead")
        similarity = cast(str, options.similarity_fct)
        if similarity != self.similarity_fct_name and self.queues.queue is not None:
            raise AttributeError(f"{name}: similarity_fct is fixed with a queue (its rows are queued as the loss "
                                 "scores them); build a new loss with similarity_fct=... instead")
        self.check_options(options)
        known = self.known_positives
        if options.known_positives is not old.known_positives:
            known = KnownPositives.for_loss(name, options.known_positives, self.model)
        if options.seed != old.seed:
            self._generator = None
        for key, value in (("options", options), ("similarity_fct_name", similarity), ("known_positives", known),
                           ("mini_batch_size", options.mini_batch_size),
                           ("mini_batch_num_tokens", options.mini_batch_num_tokens)):
            object.__setattr__(self, key, value)
        rule = _false_negative_rule(options, known)
        preparer = self.preparer
        self.preparer = BatchPreparer(name, blocks=self.blocks, rule=rule,
                                      gather_across_devices=options.gather_across_devices, uses_labels=self.uses_labels)
        self.preparer.reports_false_negatives = preparer.reports_false_negatives
        self.preparer.warned_labels = preparer.warned_labels
        self.queues.rule = rule
        warned = self.ranking._warned_unusable
        self.ranking = self._ranking()
        self.ranking._warned_unusable = warned

    def check_options(self, options: SharedOptions) -> None:
        """Raise ``ValueError`` if the shared ``options`` break a rule of this loss (its equation's): called by the
        constructor and when an option is assigned. The base checks ``similarity_fct`` against
        :meth:`cosine_only_reason`; a paper whose own arguments bound an option (Focal-InfoNCE's ``m`` and the
        temperature) extends it."""
        cosine_reason = self.cosine_only_reason()
        if options.similarity_fct != "cos_sim" and cosine_reason:
            raise ValueError(f"{type(self).__name__} needs similarity_fct=cos_sim: {cosine_reason}")

    def cosine_only_reason(self) -> str | None:
        """Why this loss's equation needs cosine similarities (then ``similarity_fct=dot_score`` is rejected), or
        ``None`` if it works with both. Called by the constructor before the loss's own arguments are set."""
        return None

    @property
    def similarity_fct(self) -> Callable[[Tensor, Tensor], Tensor]:
        """sentence-transformers' function of the similarity the loss scores with (``cos_sim`` or ``dot_score``)."""
        from sentence_transformers import util

        return util.cos_sim if self.similarity_fct_name == "cos_sim" else util.dot_score

    def queues_own_key_encoder_rows(self) -> bool:
        """Whether the loss's candidates already come from its own key encoder (AdCSE untied): the queue then
        queues those rows, and ``queue_source="ema"`` keeps no second key encoder. Called by the constructor
        before the parts are built."""
        return False

    @property
    def blocks(self) -> tuple[str, ...]:
        """The blocks of the softmax: :attr:`directions` plus ``anchor_to_anchor`` / ``positive_to_positive`` for
        ``contrast_anchors`` / ``contrast_positives`` (GISTEmbedLoss)."""
        options = self.options
        extra = (("anchor_to_anchor",) if options.contrast_anchors else ()) + (
            ("positive_to_positive",) if options.contrast_positives else ())
        return options.directions + extra

    @property
    def scale(self) -> float:
        """sentence-transformers' name of the inverse temperature: the logits are ``similarity · scale``."""
        return self.options.scale

    @property
    def controls_false_negatives(self) -> bool:
        """Whether any candidate can be masked (``mask_duplicates``, ``known_positives`` or a ``margin``)."""
        return self.preparer.controls_false_negatives

    # ------------------------------------------------------------------ the queue's options, read from loss.options
    @property
    def queue_options(self) -> QueueOptions:
        """The queue's options (``loss.options.queue``)."""
        return self.options.queue


    def check_logit_range(self, max_abs_similarity: float) -> None:
        """Raise if ``max_abs_similarity / temperature`` overflows (e.g. ``1 + m`` for Focal-InfoNCE logits)."""
        if self.similarity_fct_name == "cos_sim":
            validation.check_temperature(self.options.temperature, "temperature", max_abs_similarity)

    # ------------------------------------------------------------------ forward
    def forward(self, sentence_features: Iterable[dict[str, Tensor]], labels: Tensor | None) -> Tensor:
        sentence_features = list(sentence_features)
        vars(self)["_given_inputs"] = None  # forward sees the texts itself
        context = self.call_context(sentence_features)
        self.before_embedding(sentence_features)
        if self.uses_gradient_cache:
            return self.cached_forward(sentence_features, labels, context)
        return self.compute(self.embed(sentence_features), labels, context=context)

    def before_embedding(self, sentence_features: list[dict[str, Tensor]]) -> None:
        """Called by ``forward`` before the columns are embedded (plain or GradCache); a loss with state that must
        be ready first (AdCSE's key encoder) prepares it here."""

    def embed(self, sentence_features: list[dict[str, Tensor]]) -> list[Tensor]:
        """The embeddings of every column (uncached ``forward``): the model's, merged where sentence-transformers
        can. A loss that embeds some columns with another encoder (AdCSE's key encoder) overrides it."""
        return embed_columns(self.model, sentence_features)

    def call_context(self, sentence_features: list[dict[str, Tensor]]) -> CallContext:
        """Built by ``forward`` before the model runs: what this call knows besides the embeddings
        (:class:`~st_hardneg.losses.batch.CallContext`): each row's text key (for ``mask_duplicates`` and
        ``known_positives``) and the guide's embeddings (no gradient), and, with ``queue_source="ema"`` and
        gradients on, the queue's key encoder's rows of the input columns."""
        side = false_negatives.side_inputs(
            sentence_features, mask_duplicates=self.options.mask_duplicates or self.known_positives is not None,
            guide=self.guide, model=self.model, retokenize=self._must_retokenize)
        embed = (functools.partial(embed_without_grad, mini_batch_size=self.mini_batch_size,
                                   mini_batch_num_tokens=self.mini_batch_num_tokens)
                 if self.uses_gradient_cache else _embed_column)
        keys = self.queues.key_columns(sentence_features, embed) if self.queue is not None else None
        return CallContext(side_inputs=side, queue_keys=keys)

    def set_false_negative_inputs(self, text_keys: Tensor | None = None,
                                  guide_embeddings: list[Tensor] | None = None) -> None:
        """Provide the text keys ((num_columns, N) ids, equal = identical text) and/or the guide's embeddings (one
        (N, d') tensor per column) for the next :meth:`compute_loss_from_embeddings` call (``forward`` does this
        itself)."""
        inputs = SideInputs(
            text_keys=torch.as_tensor(text_keys, dtype=torch.long) if text_keys is not None else None,
            guide=[g.detach() for g in guide_embeddings] if guide_embeddings is not None else None)
        vars(self)["_given_inputs"] = inputs if inputs.text_keys is not None or inputs.guide is not None else None

    # ------------------------------------------------------------------ GradCache (sentence-transformers' contract)
    # uses_gradient_cache, frozen_columns, embed_minibatch and the cached forward are GradCacheMixin's, written once
    # (gradcache.py); the loss adds the call's context and its own step (2), the template a chunk of rows at a time
    def calculate_loss(self, reps: list[list[Tensor]], labels: Tensor | None = None, *,
                       with_backward: bool = False) -> Tensor:
        """Step (2) of sentence-transformers' ``CachedLossMixin``: the loss of the whole batch from the
        per-mini-batch embeddings, by :meth:`compute` a chunk of :attr:`loss_chunk_size` rows at a time; with
        ``with_backward``, back-propagated to the embeddings chunk by chunk and detached."""
        context = self._running_context()  # forward's, with the frozen columns (GradCacheMixin.cached_forward)
        return self.compute(self.gradcache.columns(reps, context), labels, chunk_size=self.loss_chunk_size,
                            with_backward=with_backward, context=context)

    @property
    def supports_row_chunks(self) -> bool:
        """Whether the loss computes its rows a window of anchors at a time (:meth:`window_rows`; else it computes
        them whole, :meth:`whole_batch_rows`)."""
        return True

    @property
    def loss_chunk_size(self) -> int:
        """Anchor rows per chunk under GradCache: ``mini_batch_size`` (as in CachedMNRL), or 32 with only
        ``mini_batch_num_tokens``."""
        return self.mini_batch_size or 32

    # ------------------------------------------------------------------ the one compute template
    def compute_loss_from_embeddings(self, embeddings: list[Tensor], labels: Tensor | None = None) -> Tensor:
        """The loss of a batch of embeddings, one per column ``[anchors, positives, negatives...]``
        (:meth:`compute` with this process's rows as one window; under GradCache the same template runs a chunk of
        rows at a time), with an empty call context, or the text keys and guide embeddings that
        :meth:`set_false_negative_inputs` gave for this call."""
        given = vars(self).get("_given_inputs")
        vars(self)["_given_inputs"] = None
        return self.compute(embeddings, labels, context=CallContext(side_inputs=given))

    def compute(self, embeddings: list[Tensor], labels: Tensor | None = None, *, chunk_size: int | None = None,
                with_backward: bool = False, context: CallContext | None = None) -> Tensor:
        """The one compute template of every loss. With autocast disabled (float32 under bf16/fp16 mixed precision
        too): ``preparer.prepare`` (the columns checked and normalised, labels warned about once), the paper's
        :meth:`begin_batch`, then per window of ``chunk_size`` anchor rows of this process (``None``: one window)
        ``preparer.window`` (the false-negative masks) → the paper's :meth:`window_rows` (or, for a loss computed
        whole, :meth:`whole_batch_rows` on one window of every row) → ``ranking.usable_sum``; then the unusable
        rows judged once (``ranking.batch_tally``, ``ranking.judge``), the paper's :meth:`end_batch` and the mean
        (``ranking.mean``); :meth:`close_batch` always, also when a step raised. ``context``: what the call knows
        besides the embeddings (:class:`~st_hardneg.losses.batch.CallContext`, built by ``forward``; ``None``: an
        empty one); the template keeps nothing of it.

        With ``with_backward`` (GradCache's step (2)) each window's rows are back-propagated to leaf copies of the
        normalised embeddings and freed before the next window, so the loss side holds O(chunk × candidates) at a
        time, never the (N, C) matrices; the gradient then flows once through the normalisation (and the
        gathering) into ``embeddings`` and the returned loss is detached. Equal to the one-window loss (loss,
        gradients, diagnostics, warnings and errors), up to float summation order."""
        with fn.autocast_disabled(embeddings):
            batch = self.preparer.prepare(embeddings, labels, min_batch_size=1,
                                          embedding_dimension=self.embedding_dimension,
                                          in_matryoshka=functools.partial(columns.in_matryoshka, self),
                                          context=context)
            if batch.size < self.min_batch_size:
                return self._skip(batch, with_backward)
            return self._run(batch, chunk_size, with_backward)

    def _skip(self, batch: Batch, with_backward: bool) -> Tensor:
        """A batch smaller than the paper's equation needs (:attr:`min_batch_size`; the Trainer's last batch under
        ``dataloader_drop_last=False``): warned once per loss and skipped, a zero loss whose gradient is zero for
        every embedding (so a Trainer step, GradCache's cached gradients and ``MatryoshkaLoss``' backward all go
        through); nothing is drawn, queued or recorded."""
        if not vars(self).get("_warned_small_batch"):
            vars(self)["_warned_small_batch"] = True
            message = (f"{type(self).__name__}: a batch of {batch.size} pair(s) is smaller than the "
                       f"{self.min_batch_size} its equation needs (it mixes or mines other in-batch pairs); the batch "
                       "is skipped (loss 0, no gradient). With the Trainer this is the last batch of an epoch: set "
                       "dataloader_drop_last=True to drop it. This warning is shown once.")
            logger.warning(message)
            warnings.warn(message, UserWarning, stacklevel=4)
        zero = (batch.anchors.sum() + batch.positives.sum() + batch.negatives.sum()) * 0.0
        if with_backward:
            if zero.requires_grad:
                zero.backward()
            return zero.detach()
        return zero

    def _run(self, batch: Batch, chunk_size: int | None, with_backward: bool) -> Tensor:
        """:meth:`compute` after the preparer: the hooks, the windows, the reduction."""
        try:
            batch = self.begin_batch(batch)
            graph: list[tuple[Tensor, Tensor]] = []  # (tensor with a graph, its leaf copy)
            if with_backward:
                leaves: dict[str, Tensor] = {}
                for name in _EMBEDDING_FIELDS:
                    value = getattr(batch, name)
                    if value is not None and value.requires_grad:
                        leaf = value.detach().requires_grad_(True)
                        graph.append((value, leaf))
                        leaves[name] = leaf
                    elif value is not None:
                        leaves[name] = value.detach()
                batch = replace(batch, **cast(dict[str, Any], leaves))
            state = batch.state  # shared by every window cut from the batch
            start, stop = self.preparer.own_rows(batch)
            whole = not self.supports_row_chunks
            windows = [(None, None)] if whole else [
                (begin, min(begin + (chunk_size or stop - start), stop))
                for begin in range(start, stop, chunk_size or max(stop - start, 1))]
            total = torch.zeros((), dtype=batch.anchors.dtype, device=batch.device)
            count, every = 0, None
            for begin, end in windows:
                window = self.preparer.window(batch, begin, end)  # the rows' false-negative masks
                rows = self.whole_batch_rows(window) if whole else self.window_rows(window)
                window_sum, window_count, every = self.ranking.usable_sum(rows, window, state.windows[-1].usable)
                if with_backward and window_sum.requires_grad:
                    window_sum.backward()
                    window_sum = window_sum.detach()
                total = total + window_sum  # the running sum
                count += window_count
            if self.queue is not None:  # after the windows, once: this batch's candidates join the queue's next reads
                self.queues.stage(batch)
            pieces = [(record.rows, record.stats) for record in state.windows]
            tally = self.ranking.batch_tally(state)
            unusable = unusable_stats(tally, self.preparer.reports_false_negatives) if tally is not None else {}
            self._last_stats = {**(pieces[0][1] if len(pieces) == 1 else combine_chunk_stats(pieces)), **unusable}
            self.ranking.judge(tally)  # raises on a batch without a usable row
            self.end_batch(batch)
        finally:
            self.close_batch()
        loss, factor = self.ranking.mean(total, count, state, every)
        if graph:
            pairs = [(tensor, leaf.grad.mul_(factor)) for tensor, leaf in graph if leaf.grad is not None]
            if pairs:
                torch.autograd.backward([t for t, _ in pairs], [g for _, g in pairs])
        return loss.detach() if with_backward else loss

    # ------------------------------------------------------------------ the paper's hooks
    def begin_batch(self, batch: Batch) -> Batch:
        """Called once per batch before its rows (all windows) are computed; returns the batch the rows are
        computed on. A loss with per-batch state puts it on the batch (``batch.state.draws``: random partners
        drawn once, AdCSE's adversary gradient) and a loss that replaces rows of the batch (HNCSE's mixed
        positives) does so here."""
        return batch

    def window_rows(self, batch: Batch) -> Tensor:
        """The (R,) per-row losses of the anchor rows of ``batch`` (:attr:`Batch.rows`, a window with its
        false-negative masks) against all its candidates: the template's step per window, in this order:
        sentence-transformers' blocks (``ranking.blocks``) → with a queue, its columns for these rows
        (``queues.read``) → the paper's columns (:meth:`paper_columns`) → the window's statistics, from the
        paper's final ``query_to_doc`` block → the queue's columns joined (``queues.join``) → the rows and their
        counts (``ranking.rows``, with the paper's logit rule :attr:`logit_margin`), recorded for the batch
        (``batch.state.windows``). Without a queue nothing of ``queue.py`` runs.

        Under GradCache it runs a chunk of anchors at a time; whatever a paper chooses per row (partners, hardest
        negatives, top-k, random draws) must not depend on which other rows share the chunk. With no paper
        columns (the base) it is InfoNCE, ``MultipleNegativesRankingLoss`` with every shared feature::

            ℓ_i = -log  e^{s(h_i, h'_i)} / (Σ_j e^{s(h_i, h'_j)} + Σ_k e^{s(h_i, n_k)})
        """
        blocks = self.ranking.blocks(batch)
        read = self.queues.read(batch) if self.queue is not None else None
        blocks = self.paper_columns(batch, blocks, read)
        q2d = blocks["query_to_doc"]
        start, stop = batch.row_range
        documents = batch.size + batch.negatives.size(0)
        stats = fn.contrastive_stats(q2d.similarity.detach(), batch.size, q2d.similarity.size(1) - documents,
                                     row_offset=start)
        stats.update(batch.false_negative_stats)
        stats.update(self.paper_stats(batch))
        if read is not None:
            blocks, joined = self.queues.join(blocks, read)
            stats.update({**read.stats, **joined})
        ranked = self.ranking.rows(batch, blocks, focal_m=self.logit_margin)
        batch.state.windows.append(WindowRecord(ranked.usable, ranked.tally, stats, stop - start))
        return ranked.losses

    def paper_columns(self, batch: Batch, blocks: dict[str, fr.Block], queue: QueueRead | None
                      ) -> dict[str, fr.Block]:
        """The paper's equation as columns: ``blocks`` (sentence-transformers' blocks of the rows of ``batch``,
        their false-negative masks applied) in, the blocks with the paper's columns out (``Block.with_columns``:
        MixCSE's mixed negative, HNCSE's mixtures, AdCSE's adversaries marked ``learned``). ``queue``: the queue's
        columns for these rows (``None``: no queue, or nothing readable yet), for a choice that may take queued
        rows; the template joins them after this. The base adds none: InfoNCE."""
        return blocks

    @property
    def logit_margin(self) -> float | None:
        """The paper's logit rule: Focal-InfoNCE's margin ``m`` (``s_p²`` for the positive, ``s_n (s_n + m)`` for
        every other entry), or ``None``: plain logits ``s / τ``."""
        return None

    def paper_stats(self, batch: Batch) -> dict[str, Tensor]:
        """The paper's own statistics of the rows of ``batch`` for the diagnostics (HNCSE's ``pm_mixed``); none by
        default. The template records the mean cosines itself, from the final ``query_to_doc`` block."""
        return {}

    def whole_batch_rows(self, batch: Batch) -> Tensor:
        """The (N,) rows of a loss computed whole (every row of the gathered batch), when it has no
        :meth:`window_rows` for chunks of rows (MixCSE's official layout); it records its window for the batch
        (``batch.state.windows``: its usable rows, counts and statistics) as :meth:`window_rows` does."""
        raise NotImplementedError(f"{type(self).__name__} computes its rows with window_rows")

    def end_batch(self, batch: Batch) -> None:
        """Called once per batch after its rows were computed without error (see :meth:`begin_batch`): a loss that
        commits per-batch work (AdCSE's adversary gradient) does it here."""

    def close_batch(self) -> None:
        """Called after every batch, also one that raised: drop what :meth:`begin_batch` prepared outside the
        batch."""

    # ------------------------------------------------------------------ shared machinery
    def generator(self, device: torch.device | str) -> torch.Generator | None:
        """The random source of the loss's random draws on ``device``: a generator seeded with ``seed``, created
        at the first draw and kept (so it advances from batch to batch), or ``None`` (torch's global generator, seeded
        by the Trainer's ``seed``) if the loss has no seed. Every random draw of a loss goes through here.
        With ``gather_across_devices`` and no seed: a fresh generator per draw, seeded from rank 0's global RNG, so
        that every process draws the same numbers."""
        seed = self.options.seed
        if seed is None:
            if self.options.gather_across_devices:  # identical draws on every process: a seed from rank 0's global RNG
                device = torch.device(device)
                return torch.Generator(device=device).manual_seed(dist.shared_seed(device))
            return None
        device = torch.device(device)
        if self._generator is None or self._generator.device != device:
            self._generator = torch.Generator(device=device).manual_seed(seed)
        return self._generator

    @property
    def diagnostics(self) -> dict[str, float]:
        """Mean cosines of the last batch seen in training: ``positive``, ``negative`` and, for losses that
        synthesise negatives, ``synthetic`` (MixCSE Fig. 4a). Empty before the first batch. With false-negative
        control also ``masked_false_negatives`` (masked candidates per anchor, mean) and
        ``masked_false_negatives_total``: always when ``margin`` is set, and from the first batch in
        which ``mask_duplicates`` masked something on. With a queue: ``queue_rows_read`` (rows in the last batch's
        denominator), ``queue_rows_masked`` (per anchor, mean), ``queue_filled`` and ``queue_memory_bytes`` (with
        ``queue_source="ema"`` also ``queue_key_encoder_bytes``)."""
        out = {key: float(value) for key, value in self._last_stats.items()}
        return {**out, **self.queues.diagnostics()}

    def paper_config(self) -> dict[str, Any]:
        """The paper's own hyperparameters: each loss returns its constructor's own arguments."""
        return {}

    def get_config_dict(self) -> dict[str, Any]:
        """Every setting that changes the loss, for the model card: the paper's hyperparameters
        (:meth:`paper_config`), then the shared options (:meth:`SharedOptions.config`: sentence-transformers' names
        first)."""
        guide = None
        if self.guide is not None:
            card = getattr(self.guide, "model_card_data", None)
            guide = getattr(card, "base_model", None) or type(self.guide).__name__
        known = self.known_positives.num_pairs if self.known_positives is not None else None
        return {**self.paper_config(), **self.options.config(known_positives=known, guide=guide)}


def _read_only(path: str, doc: str) -> property:
    return property(operator.attrgetter(path), doc=doc)


# the shared options as read-only attributes of the loss, from their one declaration (SharedOptions)
for _name in option_attributes():
    setattr(HardNegativeLoss, _name, _read_only(f"options.{_name}", f"``loss.options.{_name}`` (read-only)."))
for _option in fields(QueueOptions):
    setattr(HardNegativeLoss, f"queue_{_option.name}",
            _read_only(f"options.queue.{_option.name}", f"``loss.options.queue.{_option.name}`` (read-only)."))
#: the shared options a built loss takes a new value of, as sentence-transformers' losses keep them assignable
#: (``loss.scale = 5.0``): checked as the constructor checks them and given to the parts (``_apply_options``)
_ASSIGNABLE_OPTIONS = frozenset({*option_attributes(), "scale", "similarity_fct", "mini_batch_size",
                                 "mini_batch_num_tokens"})
#: what a built loss shows but never takes a new value of: the queue's options (its banks hold rows and state)
_FIXED_OPTIONS = frozenset({*(f"queue_{o.name}" for o in fields(QueueOptions)), "queue_options", "queue",
                            "anchor_queue", "guided"})


def _false_negative_rule(options: SharedOptions, known: KnownPositives | None) -> false_negatives.FalseNegativeRule:
    """The loss's one false-negative rule, from its options and its ``known_positives`` index."""
    return false_negatives.FalseNegativeRule(mask_duplicates=options.mask_duplicates, margin=options.margin,
                                             margin_strategy=options.margin_strategy, known_positives=known,
                                             guided=options.guided)


def _replaced(options: SharedOptions, name: str, value: Any) -> SharedOptions:
    """``options`` with the option ``name`` (a loss attribute's name) given ``value``, checked as the constructor
    checks its keyword (``scale`` and ``temperature`` resolved into τ by the same rule)."""
    if name in ("scale", "temperature"):
        tau = validation.check_scale_or_temperature(value if name == "scale" else None,
                                                    value if name == "temperature" else None)
        return replace(options, temperature=tau)
    if name == "similarity_fct":
        return replace(options, similarity_fct=validation.check_similarity_fct(value))
    return replace(options, **{name: value})


HardNegativeLoss.__init__.__signature__ = constructor_signature(HardNegativeLoss.__init__)  # type: ignore[attr-defined]
