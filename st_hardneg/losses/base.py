"""What every st-hardneg loss shares: the shared constructor options, input checking, the float32 batch, the ST
forward, random draws, reduction and the diagnostics it records.

One batch's path: ``forward`` (here; the paper may give an ``embed`` hook) → ``compute_loss_from_embeddings``, the one
compute template (here, :func:`float32_loss`) → :meth:`HardNegativeLoss.prepare_batch` (here: the columns checked by
:mod:`~st_hardneg.losses.columns`, the mask of :mod:`~st_hardneg.losses.false_negatives`) → the paper's
``window_rows`` (its own module: its equation) → :meth:`HardNegativeLoss.reduce` (here; unusable rows:
:mod:`~st_hardneg.losses.unusable`).
"""

from __future__ import annotations

import functools
import logging
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal, TypeVar, cast

import torch
from sentence_transformers import SentenceTransformer
from sentence_transformers.base.losses.merged_forward import embed_columns
from torch import Tensor, nn

from st_hardneg import functional as fn
from st_hardneg import validation
from st_hardneg.functional import ranking as fr
from st_hardneg.losses import columns, false_negatives, unusable
from st_hardneg.losses import distributed as dist
from st_hardneg.losses.batch import Batch, SideInputs
from st_hardneg.losses.blocks import ranking_blocks as build_blocks
from st_hardneg.losses.gradcache import GradCacheMixin, check_cacheable_model
from st_hardneg.losses.model_guard import ModelGuard
from st_hardneg.losses.options import LossOptions
from st_hardneg.losses.queue import CandidateQueue, queue_columns
from st_hardneg.losses.relevance import KnownPositives
from st_hardneg.losses.unusable import UnusableTally

__all__ = ["HardNegativeLoss", "LossOptions", "float32_loss"]

logger = logging.getLogger(__name__)

_Method = TypeVar("_Method", bound=Callable[..., Tensor])


def float32_loss(method: _Method) -> _Method:
    """Decorator of every loss's ``compute_loss_from_embeddings``: warn once about labels the loss does not read, run
    the loss math with autocast disabled (float32 under bf16/fp16 mixed precision too), and drop what ``forward``
    remembered for this call's false-negative mask afterwards, also when the loss raised."""

    @functools.wraps(method)
    def compute_loss_from_embeddings(self: HardNegativeLoss, embeddings: list[Tensor], labels: Tensor | None = None,
                                     *args: Any, **kwargs: Any) -> Tensor:
        self.check_labels(labels)
        try:
            with fn.autocast_disabled(embeddings):
                return method(self, embeddings, labels, *args, **kwargs)
        finally:
            self._side_inputs = None

    return compute_loss_from_embeddings  # type: ignore[return-value]


def _embed_column(module: nn.Module, features: dict[str, Tensor]) -> Tensor:
    return module(features)["sentence_embedding"]  # type: ignore[no-any-return]


class HardNegativeLoss(ModelGuard, GradCacheMixin, nn.Module):
    """Base class of the st-hardneg losses.

    Subclasses take their paper's hyperparameters and pass the shared options (:class:`LossOptions`) on, and
    implement :meth:`window_rows` (the rows of their equation; :meth:`compute_loss_from_embeddings` is the one
    template that calls it) as::

        def __init__(self, model, *, lam=0.2, **options: Unpack[LossOptions]):
            super().__init__(model, **options)
            self.lam = validation.check_unit_interval(lam, "lam")

        def window_rows(self, batch):                        # checked float32 unit rows, false-negative masks
            blocks = self.ranking_blocks(batch)              # sentence-transformers' blocks, masks applied
            ...                                              # the paper's own columns (Block.with_columns)
            return self.ranking_rows(blocks)                 # (R,) loss of each anchor row; reduce() averages

        def paper_config(self):
            return {"lam": self.lam}                         # get_config_dict() adds the shared options

    Args: the shared keyword options of every loss (sentence-transformers' names, defaults and meanings;
    false-negative control, ``known_positives``, the queue, gathering, GradCache), documented once:
    :class:`~st_hardneg.losses.options.LossOptions`. The rules shared by every loss (unusable rows, counts that
    cannot be met) are stated there too.
    """

    #: smallest batch the loss accepts (in-batch mixing needs a partner)
    min_batch_size: int = 2
    #: whether the loss reads labels (the st-hardneg losses do not; a labelled dataset triggers a warning)
    uses_labels: bool = False
    #: (this process's rows, global rows) after a gathering prepare_batch, else None
    _local_rows: tuple[slice, int] | None = None
    #: set in __dict__ by __init__ (kept out of the module tree)
    guide: SentenceTransformer | None

    def __init__(self, model: SentenceTransformer, guide: SentenceTransformer | None = None, *,
                 scale: float | None = None, temperature: float | None = None,
                 similarity_fct: Callable[[Tensor, Tensor], Tensor] | str = "cos_sim",
                 directions: tuple[fr.Direction, ...] = ("query_to_doc",),
                 partition_mode: fr.PartitionMode = "joint", hardness_mode: fr.HardnessMode | None = None,
                 hardness_strength: float = 0.0, seed: int | None = None, mask_duplicates: bool = True,
                 known_positives: Mapping[str, Any] | KnownPositives | None = None, margin: float | None = None, margin_strategy: Literal["absolute", "relative"] = "absolute",
                 contrast_anchors: bool | None = None, contrast_positives: bool | None = None,
                 gather_across_devices: bool = False, mini_batch_size: int | None = None,
                 mini_batch_num_tokens: int | None = None, show_progress_bar: bool = False,
                 queue_size: int = 0, queue_warmup_steps: int = 0, queue_max_age: int | None = None,
                 queue_checkpoint: bool = True, queue_source: Literal["online", "ema"] = "online",
                 queue_momentum: float = 0.995, queue_anchors: bool = False, queue_as_pool: bool = False,
                 **unknown: Any) -> None:
        name = type(self).__name__
        if unknown:
            key = next(iter(unknown))
            renamed = {"false_negative_margin": "margin (GISTEmbedLoss's name)",
                       "symmetric": "directions=('query_to_doc', 'doc_to_query'), partition_mode='per_direction'",
                       }
            hint = f"; it is now {renamed[key]}" if key in renamed else ""
            raise TypeError(f"{name}.__init__() got an unexpected keyword argument {key!r}{hint}")
        if isinstance(guide, int | float | str) and not isinstance(guide, nn.Module):
            # the one positional slot after `model` is GISTEmbedLoss's guide; MNRL's positional scale lands here
            hint = (f" Did you mean scale={guide!r} (sentence-transformers' MultipleNegativesRankingLoss(model, "
                    f"{guide!r})) or temperature={guide!r}?" if isinstance(guide, int | float) else "")
            raise TypeError(f"{name}: every argument after `model` is keyword-only, except a guide model "
                            f"(GISTEmbedLoss(model, guide)); got {guide!r} as the second positional argument.{hint}")
        if model is not None and not isinstance(model, nn.Module):
            raise TypeError(f"{name}: model must be a SentenceTransformer (or a torch module; None for the functional "
                            f"path compute_loss_from_embeddings), got {type(model).__name__} {model!r:.80}. Load it "
                            "first: SentenceTransformer(name) or st_hardneg.models.load_model(path).")
        super().__init__()
        self.model = model
        self.similarity_fct_name = validation.check_similarity_fct(similarity_fct)
        cosine_reason = self.cosine_only_reason()
        if self.similarity_fct_name != "cos_sim" and cosine_reason:
            raise ValueError(f"{name} needs similarity_fct=cos_sim: {cosine_reason}")
        # the cosine bound 1; a loss with larger logits (Focal's 1 + m) checks its own with check_logit_range
        self.temperature = validation.check_scale_or_temperature(scale, temperature)
        self.directions, self.partition_mode = cast(
            tuple[tuple[fr.Direction, ...], fr.PartitionMode], validation.check_directions(directions, partition_mode))
        self.hardness_mode, self.hardness_strength = cast(
            tuple[fr.HardnessMode | None, float], validation.check_hardness(hardness_mode, hardness_strength))
        self.seed = validation.check_seed(seed)
        self.gather_across_devices = validation.check_bool(gather_across_devices, "gather_across_devices")
        self.mini_batch_size = validation.check_optional_count(mini_batch_size, "mini_batch_size")
        self.mini_batch_num_tokens = validation.check_optional_count(mini_batch_num_tokens, "mini_batch_num_tokens")
        self.show_progress_bar = validation.check_bool(show_progress_bar, "show_progress_bar")
        if self.uses_gradient_cache:
            if model is None:
                raise ValueError(f"{name}: mini_batch_size / mini_batch_num_tokens need a model to embed "
                                 "the mini-batches, got model=None")
            check_cacheable_model(model, name)
        # false-negative control (the mask: st_hardneg.losses.false_negatives)
        self.mask_duplicates = validation.check_bool(mask_duplicates, "mask_duplicates")
        self.known_positives = self._known_positives_index(known_positives, model)
        if margin is None and guide is not None:
            margin = 0.0  # GISTEmbedLoss: a guide alone masks every candidate it finds closer than the positive
        self.margin = validation.check_optional_non_negative(margin, "margin")
        self.margin_strategy = validation.check_choice(margin_strategy, "margin_strategy", ("absolute", "relative"))
        self._must_retokenize = validation.check_guide(guide, model) if guide is not None else False
        # kept out of the module tree (as AdCSE's key encoder): not trained, not in state_dict(), not in the optimizer
        vars(self)["guide"] = guide
        # GISTEmbedLoss's anchor-anchor and positive-positive blocks: on by default with a guide (GIST's default),
        # off without one (MultipleNegativesRankingLoss's)
        self.contrast_anchors = validation.check_bool(
            guide is not None if contrast_anchors is None else contrast_anchors, "contrast_anchors")
        self.contrast_positives = validation.check_bool(
            guide is not None if contrast_positives is None else contrast_positives, "contrast_positives")
        if (self.contrast_anchors or self.contrast_positives) and self.partition_mode == "per_direction":
            raise ValueError(f"{name}: contrast_anchors / contrast_positives add same-type blocks without the positive "
                             "pair, which partition_mode='per_direction' cannot normalise; use partition_mode='joint' "
                             "(or contrast_anchors=False, contrast_positives=False)")
        if self.contrast_anchors and "query_to_query" in self.directions:
            raise ValueError(f"{name}: contrast_anchors=True and directions with 'query_to_query' would contrast the "
                             "anchors twice; use one of them")
        self._reports_false_negatives = False
        self._false_negative_stats: dict[str, Tensor] = {}
        self._warned_unusable = False
        #: set by ranking_rows for reduce: the rows that count in the mean (None: all)
        self._usable: Tensor | None = None
        self._zero_rows: Tensor | None = None
        #: while chunked_loss runs: the unusable-row counts of each chunk, judged together at the end
        self._chunk_tallies: list[UnusableTally] | None = None
        #: what forward saw for the next compute_loss_from_embeddings call (text keys, guide embeddings)
        self._side_inputs: SideInputs | None = None
        self._local_rows = None
        self._generator: torch.Generator | None = None
        self._last_stats: dict[str, Tensor] = {}
        self._warned_labels = False
        self.embedding_dimension = self._model_embedding_dimension(model)
        # the cross-batch queue (st_hardneg.losses.queue): off by default, exactly the loss without it
        self.queue_size = validation.check_count(queue_size, "queue_size", minimum=0)
        self.queue_warmup_steps = validation.check_count(queue_warmup_steps, "queue_warmup_steps", minimum=0)
        self.queue_max_age = validation.check_optional_count(queue_max_age, "queue_max_age")
        self.queue_checkpoint = validation.check_bool(queue_checkpoint, "queue_checkpoint")
        self.queue_source = validation.check_choice(queue_source, "queue_source", ("online", "ema"))
        self.queue_momentum = validation.check_momentum(queue_momentum, "queue_momentum")
        if not self.queue_size and (self.queue_source != "online" or self.queue_momentum != 0.995):
            raise ValueError(f"{name}: queue_source / queue_momentum set without a queue; set queue_size > 0")
        self.queue_anchors = validation.check_bool(queue_anchors, "queue_anchors")
        if self.queue_anchors and not self.queue_size:
            raise ValueError(f"{name}: queue_anchors=True without a queue; set queue_size > 0")
        if self.queue_anchors and "doc_to_query" not in self.directions:
            raise ValueError(f"{name}: queue_anchors=True queues anchors for the doc_to_query direction, which "
                             f"directions={self.directions} does not have; add 'doc_to_query' or leave "
                             "queue_anchors off")
        self.queue_as_pool = validation.check_bool(queue_as_pool, "queue_as_pool")
        if self.queue_as_pool and not self.queue_size:
            raise ValueError(f"{name}: queue_as_pool=True without a queue; set queue_size > 0")
        if self.queue_as_pool and not self.chooses_from_queue_pool:
            reason = self.queue_pool_refusal or (f"{name} makes no such choice from the candidates, so the queue is its "
                                                 "denominator only")
            raise ValueError(f"{name}: queue_as_pool=True lets a hardest-negative choice pick queued rows; {reason}. "
                             "Only MixCSELoss(partner='hardest') takes it.")
        #: the main queue's readable rows for the batch being computed (for queue_as_pool), as the loss scores them
        self._queue_vectors: Tensor | None = None
        #: with queue_source="ema": the key encoder's rows of the next batch's columns (one per column; the anchors'
        #: only with queue_anchors, else None in their place)
        self._queue_key_columns: list[Tensor | None] | None = None
        self.queue: CandidateQueue | None = None
        self.anchor_queue: CandidateQueue | None = None
        self._anchor_queue_columns: tuple[Tensor, Tensor | None] | None = None
        self._queue_columns: tuple[Tensor, Tensor | None] | None = None
        self._queue_stats: dict[str, Tensor] = {}
        if self.queue_size:
            if model is None:
                raise ValueError(f"{name}: queue_size needs the model whose optimizer steps fill the queue, got "
                                 "model=None")
            if guide is not None:
                raise ValueError(f"{name}: queue_size with a guide is not supported (the queued rows have no guide "
                                 "embeddings to apply its margin to); use margin without a guide")
            # a loss whose candidates already come from its own key encoder (AdCSE untied) queues those
            own_encoder = self.queue_source == "ema" and not vars(self).get("_candidates_from_key_encoder", False)
            self.queue = CandidateQueue(model, self.queue_size, warmup_steps=self.queue_warmup_steps,
                                        max_age=self.queue_max_age, checkpoint=self.queue_checkpoint,
                                        momentum=self.queue_momentum if own_encoder else None)
            if self.queue_anchors:  # the second bank: fed with the first's rows' source, by the same key encoder
                self.anchor_queue = CandidateQueue(model, self.queue_size, warmup_steps=self.queue_warmup_steps,
                                                   max_age=self.queue_max_age, checkpoint=self.queue_checkpoint)
            elif "doc_to_query" in self.directions:
                logger.info("%s: the queued rows join query_to_doc only; queue_anchors=True also queues the anchors "
                            "for doc_to_query", name)

    def _known_positives_index(self, known_positives: Any, model: Any) -> KnownPositives | None:
        """The index of ``known_positives`` (``None``: off, also for an empty mapping, which warns)."""
        if known_positives is None or isinstance(known_positives, KnownPositives):
            return known_positives
        name = type(self).__name__
        if not isinstance(known_positives, Mapping):
            raise TypeError(f"{name}: known_positives must map anchor texts to the texts known to be relevant to them "
                            f"(st_hardneg.data.relevance.known_positives_from_qrels builds one), got "
                            f"{type(known_positives).__name__}")
        if not validation.check_known_positives(known_positives):
            return None
        preprocess = getattr(model, "preprocess", None)
        if not callable(preprocess):
            raise ValueError(f"{name}: known_positives are texts, tokenised with the model's preprocess to match the "
                             f"batch's token ids; the model {type(model).__name__} has none (pass a "
                             "st_hardneg.losses.relevance.KnownPositives built from text keys instead)")
        return KnownPositives.from_mapping(known_positives, preprocess)

    def cosine_only_reason(self) -> str | None:
        """Why this loss's equation needs cosine similarities (then ``similarity_fct=dot_score`` is rejected), or
        ``None`` if it works with both. Called by the constructor before the loss's own arguments are set."""
        return None

    @property
    def blocks(self) -> tuple[str, ...]:
        """The blocks of the softmax: :attr:`directions` plus ``anchor_to_anchor`` / ``positive_to_positive`` for
        ``contrast_anchors`` / ``contrast_positives`` (GISTEmbedLoss)."""
        extra = (("anchor_to_anchor",) if self.contrast_anchors else ()) + (
            ("positive_to_positive",) if self.contrast_positives else ())
        return self.directions + extra

    @property
    def similarity_fct(self) -> Callable[[Tensor, Tensor], Tensor]:
        """sentence-transformers' function of the similarity the loss scores with (``cos_sim`` or ``dot_score``)."""
        from sentence_transformers import util

        return util.cos_sim if self.similarity_fct_name == "cos_sim" else util.dot_score

    @staticmethod
    def _model_embedding_dimension(model: Any) -> int | None:
        for name in ("get_embedding_dimension", "get_sentence_embedding_dimension"):
            getter = getattr(model, name, None)
            if callable(getter):
                try:
                    dim = getter()
                except Exception:  # a model that cannot tell its size: nothing to compare against
                    return None
                return int(dim) if dim is not None else None
        return None

    @property
    def controls_false_negatives(self) -> bool:
        """Whether any candidate can be masked (``mask_duplicates``, ``known_positives`` or a ``margin``)."""
        return self.mask_duplicates or self.margin is not None or self.known_positives is not None

    def check_logit_range(self, max_abs_similarity: float) -> None:
        """Raise if ``max_abs_similarity / temperature`` overflows (e.g. ``1 + m`` for Focal-InfoNCE logits)."""
        if self.similarity_fct_name == "cos_sim":
            validation.check_temperature(self.temperature, "temperature", max_abs_similarity)

    @property
    def scale(self) -> float:
        """sentence-transformers' name of the inverse temperature: the logits are ``similarity · scale``."""
        return 1.0 / self.temperature

    def forward(self, sentence_features: Iterable[dict[str, Tensor]], labels: Tensor | None) -> Tensor:
        sentence_features = self.remember_side_inputs(sentence_features)
        self.before_embedding(sentence_features)
        if self.uses_gradient_cache:
            return self.cached_forward(sentence_features, labels)
        return self.compute_loss_from_embeddings(self.embed(sentence_features), labels)

    def before_embedding(self, sentence_features: list[dict[str, Tensor]]) -> None:
        """Called by ``forward`` before the columns are embedded (plain or GradCache); a loss with state that must
        be ready first (AdCSE's key encoder) prepares it here."""

    def embed(self, sentence_features: list[dict[str, Tensor]]) -> list[Tensor]:
        """The embeddings of every column (uncached ``forward``): the model's, merged where sentence-transformers
        can. A loss that embeds some columns with another encoder (AdCSE's key encoder) overrides it."""
        return embed_columns(self.model, sentence_features)

    def remember_side_inputs(self, sentence_features: Iterable[dict[str, Tensor]]) -> list[dict[str, Tensor]]:
        """Called by ``forward`` before the model runs: keep each row's text key (for ``mask_duplicates``), the
        guide's embeddings (no gradient) and, with ``queue_source="ema"`` and gradients on, the key encoder's rows of the
        candidate columns for the next :meth:`prepare_batch`. Returns the features as a list."""
        sentence_features = list(sentence_features)
        self._side_inputs = false_negatives.side_inputs(
            sentence_features, mask_duplicates=self.mask_duplicates or self.known_positives is not None,
            guide=self.guide, model=self.model,
            retokenize=self._must_retokenize)
        self._queue_key_columns = None
        if self.queue is not None and self.queue.key_encoder is not None and torch.is_grad_enabled():
            # (the queue stages rows exactly when gradients are on: a training forward)
            embed = self._embed_without_grad if self.uses_gradient_cache else _embed_column
            self._queue_key_columns = [
                self.queue.embed_keys(features, embed) if column or self.anchor_queue is not None else None
                for column, features in enumerate(sentence_features)]
        return sentence_features

    def set_false_negative_inputs(self, text_keys: Tensor | None = None,
                                  guide_embeddings: list[Tensor] | None = None) -> None:
        """Provide the text keys ((num_columns, N) ids, equal = identical text) and/or the guide's embeddings (one
        (N, d') tensor per column) for the next :meth:`compute_loss_from_embeddings` call (``forward`` does this
        itself)."""
        inputs = SideInputs(
            text_keys=torch.as_tensor(text_keys, dtype=torch.long) if text_keys is not None else None,
            guide=[g.detach() for g in guide_embeddings] if guide_embeddings is not None else None)
        self._side_inputs = inputs if inputs.text_keys is not None or inputs.guide is not None else None

    @float32_loss
    def compute_loss_from_embeddings(self, embeddings: list[Tensor], labels: Tensor | None) -> Tensor:
        """The loss of a batch of embeddings, one per column ``[anchors, positives, negatives...]``: the one compute
        template of every loss. :meth:`prepare_batch` (this process's rows), :meth:`begin_batch`, the paper's
        :meth:`window_rows` (its equation), :meth:`reduce`, :meth:`end_batch`; :meth:`close_batch` always, also when
        a step raised. A loss computed whole (:attr:`supports_row_chunks` false) gives :meth:`whole_batch_rows`.
        GradCache's :meth:`chunked_loss` runs the same hooks a chunk of rows at a time."""
        if not self.supports_row_chunks:
            try:
                return self.reduce(self.whole_batch_rows(self.prepare_batch(embeddings, labels)))
            finally:
                self.close_batch()
        try:
            batch = self.begin_batch(self.prepare_batch(embeddings, labels, own_rows=True))
            loss = self.reduce(self.window_rows(batch))
            self.end_batch(batch)
            return loss
        finally:
            self.close_batch()

    def whole_batch_rows(self, batch: Batch) -> Tensor:
        """The (N,) rows of a loss computed whole (every row of the gathered batch), when it has no
        :meth:`window_rows` for chunks of rows (MixCSE's official layout)."""
        raise NotImplementedError(f"{type(self).__name__} computes its rows with window_rows")

    # ------------------------------------------------------------------ input
    def check_labels(self, labels: Tensor | None) -> None:
        """Warn once per loss if it receives labels it ignores. ``None`` and an all-zeros tensor (what
        sentence-transformers passes for a dataset without a label column: ``None`` in the Trainer, zeros from
        ``InputExample``'s default label in the legacy ``fit``) are silent."""
        if self.uses_labels or self._warned_labels or labels is None:
            return
        if isinstance(labels, Tensor):
            if labels.numel() == 0 or labels.device.type == "meta" or not bool(labels.ne(0).any()):
                return
        self._warned_labels = True
        warnings.warn(
            f"{type(self).__name__} does not use labels but received some (the dataset has a 'label'/'score' "
            "column). They are ignored; if they are similarity scores you probably want a loss that reads them, "
            "e.g. CoSENTLoss. This warning is shown once per loss.",
            UserWarning,
            stacklevel=3,
        )

    def prepare_batch(self, embeddings: list[Tensor], labels: Tensor | None = None, own_rows: bool = False) -> Batch:
        """Check the columns and return them in float32, normalised once, as a :class:`Batch` with the
        false-negative masks of its rows: every row of the (gathered) batch, or with ``own_rows`` this process's
        own rows (:meth:`prepare_columns`, then :meth:`window`)."""
        batch = self.prepare_columns(embeddings, labels)
        if own_rows and self._local_rows is not None:
            own = self._local_rows[0]
            return self.window(batch, own.start, own.stop)
        return self.window(batch, None)

    def own_row_range(self, batch: Batch) -> tuple[int, int]:
        """``[start, stop)`` of this process's rows in ``batch`` (all of them without a gathering)."""
        if self._local_rows is not None:
            own = self._local_rows[0]
            return own.start, own.stop
        return 0, batch.size

    def window(self, batch: Batch, start: int | None, stop: int | None = None) -> Batch:
        """``batch`` restricted to the anchor rows ``[start, stop)`` (``None``: every row), with the false-negative
        masks of those rows (``false_negatives``, ``block_masks``) and their counts in the diagnostics."""
        from dataclasses import replace

        rows = None if start is None else (int(start), int(stop if stop is not None else batch.size))
        if self.mask_duplicates:  # computed once on the batch the windows are cut from, not once per window
            false_negatives.duplicate_ids(batch)
        nothing_to_mask = self._nothing_to_mask(batch)
        batch = replace(batch, rows=rows, false_negatives=None, block_masks=None)
        self._false_negative_stats = {}
        if not self.controls_false_negatives:
            return batch
        if nothing_to_mask:
            if self._reports_false_negatives:  # reported as 0 once reporting started
                zero = torch.zeros((), device=batch.device)
                self._false_negative_stats = {"masked_false_negatives": zero, "masked_false_negatives_total": zero}
            return batch
        batch.false_negatives, stats = false_negatives.false_negative_mask(
            batch, mask_duplicates=self.mask_duplicates, margin=self.margin,
            margin_strategy=self.margin_strategy)
        batch.block_masks = false_negatives.block_masks(
            batch, frozenset(self.blocks) - {"query_to_doc"}, mask_duplicates=self.mask_duplicates,
            margin=self.margin, margin_strategy=self.margin_strategy)
        # Reported once anything can be masked beyond exact duplicates (a threshold is set), or from the first batch
        # in which a duplicate was masked on: on duplicate-free data the default diagnostics stay as they were.
        total = stats["masked_false_negatives_total"]
        if not self._reports_false_negatives and (
                self.margin is not None or (total.device.type != "meta" and bool(total > 0))):
            self._reports_false_negatives = True
        if self._reports_false_negatives:
            self._false_negative_stats = stats
        return batch

    def _nothing_to_mask(self, batch: Batch) -> bool:
        """Whether the false-negative mask of every row of ``batch`` is certainly empty, so that the windows carry
        none (``None`` is what an all-False mask computes, without its (rows x candidates) tensors and their
        per-chunk cost): only duplicates are masked (no ``margin``), the loss's blocks are ``query_to_doc`` and at
        most ``doc_to_query`` (its mask is the transposed in-batch part of the first), and no two candidates share an
        embedding id or a text key. Decided once per batch (kept on it)."""
        if (not self.mask_duplicates or self.margin is not None or self.known_positives is not None
                or not set(self.blocks) <= {"query_to_doc", "doc_to_query"}):
            return False
        cached = batch.nothing_to_mask
        if cached is None:
            ids = false_negatives.duplicate_ids(batch)
            if ids is None:  # the meta device: no values to decide on
                return False
            candidate_ids = ids[batch.size:]
            distinct = bool(torch.unique(candidate_ids).numel() == candidate_ids.numel())
            if distinct and batch.text_keys is not None:
                keys = batch.text_keys[1:].reshape(-1)
                distinct = bool(torch.unique(keys).numel() == keys.numel())
            cached = batch.nothing_to_mask = distinct
        return cached

    def prepare_columns(self, embeddings: list[Tensor], labels: Tensor | None = None) -> Batch:
        """Check the columns and return them in float32, normalised once, as a :class:`Batch` (with gathering: of
        every process's rows), with the text keys and guide embeddings that ``forward`` saw; no masks yet
        (:meth:`window` adds those of the rows a loss computes).

        Raises ``ValueError`` for fewer than 2 columns, columns that are not (batch, dim) tensors of one batch size
        and one width, a width that differs from the model's embedding dimension recorded at construction, a batch
        smaller than :attr:`min_batch_size`, and NaN / inf entries or a norm beyond float32's range (naming the
        column). Large but finite vectors (entries of 1e20, whose squares overflow) are normalised exactly.
        """
        self.check_labels(labels)
        name = type(self).__name__
        raw = columns.checked_columns(list(embeddings), name=name, min_batch_size=self.min_batch_size,
                                      embedding_dimension=self.embedding_dimension,
                                      in_matryoshka=self._in_matryoshka)
        embeddings, n = raw, raw[0].size(0)
        units = [fn.normalize(column) for column in raw]
        self._local_rows = None
        if self.gather_across_devices and dist.is_distributed():
            # Every column of every process, in rank order (with gradient), normalised again row by row (the same
            # float operations on the same rows); reduce() then averages this process's own rows.
            dist.check_equal_local_batches(n, raw[0].device)
            raw = [dist.gather_with_grad(column) for column in raw]
            units = [fn.normalize(column) for column in raw]
            self._local_rows = (dist.local_rows(n), raw[0].size(0))
        # a pair with a (near-)zero anchor or positive has no direction: it cannot be ranked (unusable)
        self._zero_rows = (fn.row_norms(raw[0].detach()).squeeze(-1) < fn.NORM_EPS) | (
            fn.row_norms(raw[1].detach()).squeeze(-1) < fn.NORM_EPS)
        batch = Batch.from_units(units, raw=raw)
        inputs, self._side_inputs = self._side_inputs, None
        self._false_negative_stats = {}
        if not self.controls_false_negatives:
            return batch
        batch = false_negatives.attach_side_inputs(
            batch, inputs, len(embeddings), needs_guide=self.guide is not None,
            gathered=self._local_rows is not None, loss_name=type(self).__name__)
        if self.known_positives is not None and batch.device.type != "meta":
            if batch.text_keys is None:
                raise ValueError(f"{name}: known_positives needs the rows' texts (their token ids), which only forward() "
                                 "sees; call the loss through forward() / the Trainer, or pass text_keys with "
                                 "set_false_negative_inputs() before compute_loss_from_embeddings()")
            batch.known = self.known_positives
            self.known_positives.note_batch(batch.text_keys[0], name)
        return batch

    def _in_matryoshka(self) -> bool:
        """Whether ``MatryoshkaLoss`` / ``Matryoshka2dLoss`` is calling this loss with truncated embeddings: it
        decorates the model's ``forward`` with its ``ForwardDecorator`` for the duration of the call, or (GradCache)
        this loss's ``calculate_loss`` with its ``CachedLossDecorator``."""
        from sentence_transformers.sentence_transformer.losses.matryoshka import CachedLossDecorator, ForwardDecorator

        return (isinstance(getattr(self.model, "forward", None), ForwardDecorator)
                or isinstance(self.__dict__.get("calculate_loss"), CachedLossDecorator))

    # ------------------------------------------------------------------ ranking (sentence-transformers' directions)
    def ranking_blocks(self, batch: Batch) -> dict[str, fr.Block]:
        """The blocks of :attr:`blocks` for the rows of ``batch`` (:func:`st_hardneg.losses.blocks.ranking_blocks`
        with this loss's similarity and hardness options); then the queue's columns for these rows are read and this
        batch's candidates staged. A loss appends its own columns with :meth:`Block.with_columns`."""
        dot = self.similarity_fct_name == "dot_score"
        local = self._local_rows
        out = build_blocks(batch, self.blocks, dot=dot, hardness_mode=self.hardness_mode,
                           hardness_strength=self.hardness_strength,
                           rows_per_process=local[0].stop - local[0].start if local is not None else None)
        row_queries = batch.raw_rows()[0] if dot else batch.row_anchors
        self._queue_columns = self._read_and_stage_queue(batch, row_queries)
        return out

    def queue_pool(self) -> tuple[Tensor, Tensor | None, Tensor] | None:
        """``queue_as_pool``: the main queue's readable rows for the rows being computed, as
        ``(similarity (R, Q), exclude (R, Q) or None, rows (Q, d))`` (read by :meth:`ranking_blocks`), or ``None``."""
        if self._queue_columns is None or self._queue_vectors is None:
            return None
        similarity, exclude = self._queue_columns
        return similarity, exclude, self._queue_vectors

    def note_queue_stats(self, **stats: Tensor) -> None:
        """Add the loss's own queue statistics (e.g. MixCSE's ``queue_partner_fraction``) to :attr:`diagnostics`."""
        self._queue_stats = {**self._queue_stats, **stats}

    #: whether the loss has a hardest-negative choice that can take queued rows (``queue_as_pool``)
    chooses_from_queue_pool: bool = False
    #: why a loss with such a choice still refuses ``queue_as_pool`` (None: it has no such choice)
    queue_pool_refusal: str | None = None

    def _read_and_stage_queue(self, batch: Batch, queries: Tensor) -> tuple[Tensor, Tensor | None] | None:
        """The queue's columns for the rows of this batch, ``(similarity (R, Q), exclude (R, Q) or None)``, or
        ``None``; then (once per batch: at its first window) this batch's candidates are staged (they enter the
        queue after the optimizer step, so a batch never reads itself). With ``queue_anchors`` the same for the
        anchors' bank, whose columns for ``doc_to_query`` are kept in ``_anchor_queue_columns``."""
        if self.queue is None:
            return None
        dot = self.similarity_fct_name == "dot_score"
        self._queue_stats = {}
        read = self._queue_columns_for(self.queue, batch, queries, batch.row_anchors)
        columns, self._queue_vectors = (read[:2], read[2]) if read is not None else (None, None)
        self._anchor_queue_columns = None
        if self.anchor_queue is not None:
            row_positives = batch.raw_rows()[1] if dot else batch.row_positives
            anchors_read = self._queue_columns_for(self.anchor_queue, batch, row_positives, batch.row_positives)
            self._anchor_queue_columns = anchors_read[:2] if anchors_read is not None else None
        if batch.rows is None or batch.rows[0] == self.own_row_range(batch)[0]:  # once per batch: its first window
            ema = self.queue.key_encoder is not None and torch.is_grad_enabled()
            key_rows = self._key_encoder_rows(dot) if ema else None
            candidates = batch.raw_candidates if dot else batch.candidates
            if key_rows is not None:
                candidates = torch.cat(key_rows[1:])
            keys_now = batch.text_keys[1:].reshape(-1) if batch.text_keys is not None else None
            self.queue.stage(candidates, keys_now)
            if self.anchor_queue is not None:
                anchors = key_rows[0] if key_rows is not None else (batch.raw_anchors if dot else batch.anchors)
                self.anchor_queue.stage(cast(Tensor, anchors),
                                        batch.text_keys[0] if batch.text_keys is not None else None)
        return columns

    def _queue_columns_for(self, queue: CandidateQueue, batch: Batch, rows: Tensor, unit_rows: Tensor
                           ) -> tuple[Tensor, Tensor | None, Tensor] | None:
        """:func:`~st_hardneg.losses.queue.queue_columns` with this loss's false-negative options (its counts join
        the queue's diagnostics)."""
        read = queue_columns(queue, batch, rows, unit_rows, dot=self.similarity_fct_name == "dot_score",
                             mask_duplicates=self.mask_duplicates, known_positives=self.known_positives,
                             anchor_bank=queue is not self.queue, margin=self.margin,
                             margin_strategy=self.margin_strategy)
        if read is None:
            return None
        similarity, exclude, vectors, stats = read
        self._queue_stats = {**self._queue_stats, **stats}
        return similarity, exclude, vectors

    def _key_encoder_rows(self, dot: bool) -> list[Tensor]:
        """``queue_source="ema"``: the key encoder's rows of this batch, one tensor per column (the anchors' only
        with ``queue_anchors``, else an empty tensor), gathered from every process like the batch, normalised
        unless ``dot_score``."""
        columns, self._queue_key_columns = self._queue_key_columns, None
        if columns is None:
            raise ValueError(
                f"{type(self).__name__}: queue_source='ema' queues the key encoder's embeddings of the input texts, "
                "so it needs forward(sentence_features, labels) in training; compute_loss_from_embeddings alone "
                "cannot feed it (use queue_source='online', or call the loss on the features)")
        out = []
        for column in columns:
            if column is None:
                out.append(torch.empty(0))
                continue
            column = column.float()
            if self._local_rows is not None:  # the batch was gathered: so are the keys, in rank order
                column = dist.gather(column)
            out.append(column if dot else fn.normalize(column))
        return out

    def ranking_rows(self, blocks: dict[str, fr.Block], focal_m: float | None = None,
                     uncounted_columns: int = 0) -> Tensor:
        """The (N,) per-row losses of the blocks (:func:`st_hardneg.functional.ranking.ranking_rows` with this
        loss's scale and partition mode); warns once when rows have no negative left (every candidate masked).
        With a queue its readable rows join ``query_to_doc`` here, after the loss chose its own negatives from the
        batch. ``uncounted_columns``: columns of ``query_to_doc`` that are negatives in the loss but do not make a
        row usable (AdCSE's adversaries: learned vectors, not data; they are never masked)."""
        if self._queue_columns is not None:
            similarity, exclude = self._queue_columns
            self._queue_columns = None
            blocks = {**blocks, "query_to_doc": blocks["query_to_doc"].with_columns(similarity, exclude)}
            self._queue_stats = {**self._queue_stats, "queue_rows_read": torch.tensor(float(similarity.size(1))),
                                 **({"queue_rows_masked": exclude.sum(dim=1).float().mean().detach()}
                                    if exclude is not None else {})}
            self._last_stats = {**self._last_stats, **self._queue_stats}  # whether stats come before or after
        if self._anchor_queue_columns is not None and "doc_to_query" in blocks:
            similarity, exclude = self._anchor_queue_columns
            self._anchor_queue_columns = None
            blocks = {**blocks, "doc_to_query": blocks["doc_to_query"].with_columns(similarity, exclude)}
            self._queue_stats = {**self._queue_stats, "anchor_queue_rows_read": torch.tensor(float(similarity.size(1)))}
            self._last_stats = {**self._last_stats, **self._queue_stats}
        self._count_unusable_rows(blocks, uncounted_columns)
        return fr.ranking_rows(blocks, self.scale, self.partition_mode, focal_m)

    def _window_zero_rows(self, start: int, n: int) -> Tensor | None:
        """(n,) bool: the rows ``start .. start + n`` whose anchor or positive has a (near-)zero norm, or ``None``."""
        zero = getattr(self, "_zero_rows", None)
        if zero is None or zero.device.type == "meta" or zero.size(0) < start + n:
            return None
        return zero[start:start + n]

    def _count_unusable_rows(self, blocks: dict[str, fr.Block], uncounted_columns: int = 0) -> None:
        """Count the negatives left to each row of the ranking ``blocks``
        (:func:`~st_hardneg.losses.unusable.count_negatives`) and hand them to :meth:`note_unusable_rows`."""
        available, n, masked, total = unusable.count_negatives(blocks, uncounted_columns)
        self.note_unusable_rows(available, n, masked, total, start=blocks["query_to_doc"].row_offset)

    def note_unusable_rows(self, available: Tensor | None, n: int, masked: Tensor | int = 0, total: int = 0,
                           start: int = 0) -> None:
        """The one rule for rows that cannot teach anything, for every loss and layout. A row is unusable when it
        has no unmasked negative (``available``, the (n,) count of negatives left to each row, is 0: every candidate
        was masked as a false negative; columns that are not data, AdCSE's adversaries, do not count) or when its anchor or positive has a norm below ``NORM_EPS`` (no direction:
        cosine 0 with everything). :meth:`reduce` averages the usable rows only; a batch with no usable row raises
        ``ValueError``; the first batch with some unusable rows warns once per loss (``warnings`` and ``logging``),
        with the counts, which :attr:`diagnostics` reports as ``rows_without_negatives``, ``zero_norm_rows``,
        ``unusable_fraction`` and ``masked_fraction`` (``masked`` of ``total`` × n candidates). ``available`` is
        ``None`` when nothing was masked and every row has negatives. The rows are ``start .. start + n`` of the
        batch (a chunk of anchors, or this process's rows)."""
        self._usable = None
        device = available.device if available is not None else None
        if device is not None and device.type == "meta":
            return
        zero = self._window_zero_rows(start, n)
        usable = unusable.usable_rows(available, zero)
        count_zero = int(zero.sum()) if zero is not None else 0
        count_empty = int((available == 0).sum()) if available is not None else 0
        count_unusable = n - int(usable.sum()) if usable is not None else 0
        if count_unusable:
            self._usable = usable
        tally = UnusableTally(n, count_empty, count_zero, count_unusable, float(masked), total * n,
                              available is not None)
        if self._chunk_tallies is not None:  # chunked rows: judged once for the whole batch (chunked_loss)
            self._chunk_tallies.append(tally)
            return
        self._judge_unusable(self._global_tally(tally))

    def _global_tally(self, tally: UnusableTally) -> UnusableTally:
        """With a gathered batch of which this process computed its own rows only: the counts of every process
        (one all-reduce), so that every process judges the same global batch."""
        if self._local_rows is None or tally.rows == self._local_rows[1]:
            return tally
        device = self._zero_rows.device if self._zero_rows is not None else "cpu"
        return UnusableTally.from_values(dist.sum_across(tally.as_tensor(device)).tolist())

    def _judge_unusable(self, tally: UnusableTally) -> None:
        """Record the counts of a batch's unusable rows in the diagnostics, raise when none is usable, warn once."""
        stats = unusable.unusable_stats(tally, self._reports_false_negatives)
        self._false_negative_stats = {**self._false_negative_stats, **stats}
        self._last_stats = {**self._last_stats, **stats}
        name = type(self).__name__
        causes = unusable.unusable_causes(tally, self.known_positives is not None)
        if tally.unusable == tally.rows:
            raise ValueError(f"{name}: no usable row in this batch: " + "; ".join(causes) + ". There is nothing to "
                             "learn from it.")
        if tally.unusable and not self._warned_unusable:
            self._warned_unusable = True
            message = (f"{name}: " + "; ".join(causes) + ". They teach nothing and are left out of the batch's mean "
                       "loss. The diagnostics report rows_without_negatives, zero_norm_rows, unusable_fraction and "
                       "masked_fraction. This warning is shown once.")
            logger.warning(message)
            warnings.warn(message, UserWarning, stacklevel=5)

    # ------------------------------------------------------------------ rows a chunk of anchors at a time
    def window_rows(self, batch: Batch) -> Tensor:
        """The (R,) per-row losses of the anchor rows of ``batch`` (:attr:`Batch.rows`) against all its candidates.
        A loss that implements it computes its rows a chunk of anchors at a time under GradCache
        (:meth:`chunked_loss`); whatever it chooses per row (partners, hardest negatives, top-k, random draws) must
        not depend on which other rows share the chunk."""
        raise NotImplementedError

    def begin_batch(self, batch: Batch) -> Batch:
        """Called once per batch before its rows (all windows) are computed; returns the batch the rows are
        computed on. A loss with per-batch state prepares it here (random partners drawn once, AdCSE's adversary
        gradient) and a loss that replaces rows of the batch (HNCSE's mixed positives) does so here."""
        return batch

    def end_batch(self, batch: Batch) -> None:
        """Called once per batch after its rows were computed without error (see :meth:`begin_batch`): a loss that
        commits per-batch work (AdCSE's adversary gradient) does it here."""

    def close_batch(self) -> None:
        """Called after every batch, also one that raised: drop what :meth:`begin_batch` prepared."""

    @property
    def supports_row_chunks(self) -> bool:
        """Whether the loss implements :meth:`window_rows` (then GradCache computes it in chunks of anchors)."""
        return type(self).window_rows is not HardNegativeLoss.window_rows

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
            self._chunk_tallies = []
            try:
                for begin in range(start, stop, self.loss_chunk_size):
                    end = min(begin + self.loss_chunk_size, stop)
                    rows = self.window_rows(self.window(leaf_batch, begin, end))
                    usable, self._usable = self._usable, None
                    chunk = (rows * usable).sum() if usable is not None else rows.sum()
                    if with_backward and chunk.requires_grad:
                        chunk.backward()
                    total = total + chunk.detach()
                    pieces.append((end - begin, dict(self._last_stats)))
                tallies = self._chunk_tallies
                self.end_batch(leaf_batch)
            finally:
                self._chunk_tallies = None
                self.close_batch()
            self._last_stats = unusable.combine_chunk_stats(pieces)
            tally = self._global_tally(sum(tallies[1:], tallies[0])) if tallies else None
            if tally is not None:
                self._judge_unusable(tally)  # raises on a batch without a usable row
            local_usable = (stop - start) - (sum(t.unusable for t in tallies) if tallies else 0)
            if self._local_rows is not None:
                world = self._local_rows[1] // (stop - start)
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

    # ------------------------------------------------------------------ shared machinery
    def generator(self, device: torch.device | str) -> torch.Generator | None:
        """The random source of the loss's random draws on ``device``: a generator seeded with :attr:`seed`, created
        at the first draw and kept (so it advances from batch to batch), or ``None`` (torch's global generator, seeded
        by the Trainer's ``seed``) if the loss has no seed. Every random draw of a loss goes through here.
        With ``gather_across_devices`` and no seed: a fresh generator per draw, seeded from rank 0's global RNG, so
        that every process draws the same numbers."""
        if self.seed is None:
            if self.gather_across_devices:  # identical draws on every process: a seed from rank 0's global RNG
                device = torch.device(device)
                return torch.Generator(device=device).manual_seed(dist.shared_seed(device))
            return None
        device = torch.device(device)
        if self._generator is None or self._generator.device != device:
            self._generator = torch.Generator(device=device).manual_seed(self.seed)
        return self._generator

    def reduce(self, rows: Tensor) -> Tensor:
        """The loss of the batch from the (N,) per-anchor losses: the mean of the usable rows (all of them unless
        :meth:`note_unusable_rows` found some without a negative or with a zero-norm embedding). After a gathering
        :meth:`prepare_batch`, ``rows`` covers the global batch and the mean is over this process's own rows."""
        usable = getattr(self, "_usable", None)
        self._usable = None
        if usable is not None and usable.size(0) != rows.size(0):
            usable = None
        if self._local_rows is not None:
            own, total = self._local_rows
            world = total // (own.stop - own.start)
            if rows.size(0) == own.stop - own.start and rows.size(0) != total:
                # this process's own rows only: the mean over every process's usable rows, weighted so that the
                # processes' mean (what DDP averages) is that global mean (one all-reduce of the count)
                count = usable.sum() if usable is not None else torch.tensor(rows.size(0), device=rows.device)
                global_count = dist.sum_across(count.to(rows.dtype))
                mine = (rows * usable).sum() if usable is not None else rows.sum()
                return mine * world / global_count.clamp_min(1)
            if rows.size(0) != total:
                raise ValueError(f"{type(self).__name__}.reduce: expected one loss per row of the gathered batch "
                                 f"({total}) or of this process ({own.stop - own.start}), got {rows.size(0)}")
            if usable is not None:
                # the mean over every process's usable rows: this process's sum, weighted so that the processes'
                # mean (what DDP averages) is that global mean
                return (rows[own] * usable[own]).sum() * world / usable.sum().clamp_min(1)
            rows = rows[own]
        if usable is not None:
            return rows[usable].mean()
        return rows.mean()

    def record_stats(self, cos: Tensor, num_in_batch: int, num_synthetic: int = 0,
                     extra: dict[str, Tensor] | None = None, row_offset: int = 0) -> None:
        """Remember the batch's mean cosines (and ``extra`` scalars) for :attr:`diagnostics` (no gradient, no device
        sync). ``row_offset``: the batch index of ``cos``'s first row (a chunk of anchors)."""
        stats = fn.contrastive_stats(cos.detach(), num_in_batch, num_synthetic, row_offset=row_offset)
        stats.update(self._false_negative_stats)
        stats.update(self._queue_stats)
        for key, value in (extra or {}).items():
            stats[key] = value.detach() if isinstance(value, Tensor) else torch.as_tensor(value)
        self._last_stats = stats

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
        if self.queue is not None:
            out["queue_filled"] = float(self.queue.filled)
            out["queue_memory_bytes"] = float(self.queue.memory_bytes)
            if self.queue.key_encoder is not None:
                out["queue_key_encoder_bytes"] = float(self.queue.key_encoder_bytes)
        if self.anchor_queue is not None:
            out["anchor_queue_filled"] = float(self.anchor_queue.filled)
            out["queue_memory_bytes"] += float(self.anchor_queue.memory_bytes)
        return out

    def paper_config(self) -> dict[str, Any]:
        """The paper's own hyperparameters: each loss returns its constructor's own arguments."""
        return {}

    def get_config_dict(self) -> dict[str, Any]:
        """Every setting that changes the loss, for the model card: the paper's hyperparameters
        (:meth:`paper_config`), then the shared options (sentence-transformers' names first)."""
        config = {**self.paper_config(), "scale": self.scale, "temperature": self.temperature,
                  "similarity_fct": self.similarity_fct_name, "directions": self.directions,
                  "partition_mode": self.partition_mode, "hardness_mode": self.hardness_mode,
                  "hardness_strength": self.hardness_strength, "seed": self.seed,
                  "mask_duplicates": self.mask_duplicates,
                  **({"known_positives": self.known_positives.num_pairs} if self.known_positives is not None else {}),
                  "margin": self.margin,
                  "margin_strategy": self.margin_strategy, "contrast_anchors": self.contrast_anchors,
                  "contrast_positives": self.contrast_positives}
        if self.queue_size:
            config.update({"queue_size": self.queue_size, "queue_warmup_steps": self.queue_warmup_steps,
                           "queue_max_age": self.queue_max_age, "queue_checkpoint": self.queue_checkpoint,
                           "queue_source": self.queue_source, "queue_anchors": self.queue_anchors,
                           "queue_as_pool": self.queue_as_pool,
                           **({"queue_momentum": self.queue_momentum} if self.queue_source == "ema" else {})})
        if self.guide is not None:
            card = getattr(self.guide, "model_card_data", None)
            config["guide"] = getattr(card, "base_model", None) or type(self.guide).__name__
        return {**config, "gather_across_devices": self.gather_across_devices,
                "mini_batch_size": self.mini_batch_size, "mini_batch_num_tokens": self.mini_batch_num_tokens}
