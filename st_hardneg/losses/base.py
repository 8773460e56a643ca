"""What every st-hardneg loss shares: the shared constructor options, the ST forward, the one compute template, random
draws and the diagnostics it records; the rest comes from mixins that do not import this module.

One batch's path: ``forward`` (here; the paper may give an ``embed`` hook) → ``compute_loss_from_embeddings``, the one
compute template (here, :func:`float32_loss`) → ``prepare_batch`` (:mod:`~st_hardneg.losses.prepare`: the columns
checked by :mod:`~st_hardneg.losses.columns`, the mask of :mod:`~st_hardneg.losses.false_negatives`) → the paper's
``window_rows`` (its own module: its equation), which calls ``ranking_blocks`` / ``ranking_rows``
(:mod:`~st_hardneg.losses.blocks`, with the queue of :mod:`~st_hardneg.losses.queue`) → ``reduce`` (beside them in
:mod:`~st_hardneg.losses.blocks`: the unusable rows left out). GradCache's loss side a chunk of rows at a time:
``chunked_loss`` (:mod:`~st_hardneg.losses.gradcache`).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal, TypeVar, cast

import torch
from sentence_transformers import SentenceTransformer
from sentence_transformers.base.losses.merged_forward import embed_columns
from torch import Tensor, nn

from st_hardneg import functional as fn
from st_hardneg import validation
from st_hardneg.functional import ranking as fr
from st_hardneg.losses import distributed as dist
from st_hardneg.losses import false_negatives
from st_hardneg.losses.batch import Batch, SideInputs
from st_hardneg.losses.blocks import RankingMixin
from st_hardneg.losses.gradcache import ChunkedLossMixin, check_cacheable_model
from st_hardneg.losses.model_guard import ModelGuard, tag_model_card
from st_hardneg.losses.options import LossOptions, QueueOptions, SharedOptions, not_given
from st_hardneg.losses.relevance import KnownPositives

__all__ = ["HardNegativeLoss", "LossOptions", "QueueOptions", "SharedOptions", "float32_loss"]

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


class HardNegativeLoss(ModelGuard, ChunkedLossMixin, RankingMixin, nn.Module):
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
            return self.ranking_rows(batch, blocks)          # (R,) loss of each anchor row; reduce() averages

        def paper_config(self):
            return {"lam": self.lam}                         # get_config_dict() adds the shared options

    Args: the shared keyword options of every loss (sentence-transformers' names, defaults and meanings;
    false-negative control, ``known_positives``, the queue, gathering, GradCache), documented once:
    :class:`~st_hardneg.losses.options.LossOptions`. The rules shared by every loss (unusable rows, counts that
    cannot be met) are stated there too. They are checked as one value, kept as ``loss.options``
    (:class:`~st_hardneg.losses.options.SharedOptions`; the attributes of the same names read it); what needs the
    model or the guide is checked here.
    """

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
                 queue: QueueOptions | int | None = None, queue_size: int = not_given(0),
                 queue_warmup_steps: int = not_given(0), queue_max_age: int | None = not_given(None),
                 queue_checkpoint: bool = not_given(True), queue_source: Literal["online", "ema"] = not_given("online"),
                 queue_momentum: float = not_given(0.995), queue_anchors: bool = not_given(False),
                 queue_as_pool: bool = not_given(False), **unknown: Any) -> None:
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
        options = SharedOptions.from_keywords(
            name, scale=scale, temperature=temperature, similarity_fct=similarity_fct, directions=directions,
            partition_mode=partition_mode, hardness_mode=hardness_mode, hardness_strength=hardness_strength,
            seed=seed, mask_duplicates=mask_duplicates, known_positives=known_positives, margin=margin,
            margin_strategy=margin_strategy, contrast_anchors=contrast_anchors,
            contrast_positives=contrast_positives, gather_across_devices=gather_across_devices,
            mini_batch_size=mini_batch_size, mini_batch_num_tokens=mini_batch_num_tokens,
            show_progress_bar=show_progress_bar, queue=queue, queue_size=queue_size,
            queue_warmup_steps=queue_warmup_steps, queue_max_age=queue_max_age, queue_checkpoint=queue_checkpoint,
            queue_source=queue_source, queue_momentum=queue_momentum, queue_anchors=queue_anchors,
            queue_as_pool=queue_as_pool, guided=guide is not None)
        super().__init__()
        self.model = model
        #: the checked shared options (the attributes below are their values)
        self.options = options
        self.similarity_fct_name = cast(str, options.similarity_fct)
        cosine_reason = self.cosine_only_reason()
        if self.similarity_fct_name != "cos_sim" and cosine_reason:
            raise ValueError(f"{name} needs similarity_fct=cos_sim: {cosine_reason}")
        # τ checked for the cosine bound 1; a loss with larger logits (Focal's 1 + m) checks its own with
        # check_logit_range
        self.temperature = options.temperature
        self.directions, self.partition_mode = options.directions, options.partition_mode
        self.hardness_mode, self.hardness_strength = options.hardness_mode, options.hardness_strength
        self.seed, self.gather_across_devices = options.seed, options.gather_across_devices
        self.mini_batch_size, self.mini_batch_num_tokens = options.mini_batch_size, options.mini_batch_num_tokens
        self.show_progress_bar = options.show_progress_bar
        if self.uses_gradient_cache:
            if model is None:
                raise ValueError(f"{name}: mini_batch_size / mini_batch_num_tokens need a model to embed "
                                 "the mini-batches, got model=None")
            check_cacheable_model(model, name)
        # false-negative control (the mask: st_hardneg.losses.false_negatives)
        self.mask_duplicates = options.mask_duplicates
        self.known_positives = self._known_positives_index(known_positives, model)
        self.margin, self.margin_strategy = options.margin, options.margin_strategy
        self._must_retokenize = validation.check_guide(guide, model) if guide is not None else False
        # kept out of the module tree (as AdCSE's key encoder): not trained, not in state_dict(), not in the optimizer
        vars(self)["guide"] = guide
        self.contrast_anchors = cast(bool, options.contrast_anchors)
        self.contrast_positives = cast(bool, options.contrast_positives)
        self._reports_false_negatives = False
        self._warned_unusable = False
        #: what forward saw for the next compute_loss_from_embeddings call (text keys, guide embeddings)
        self._side_inputs: SideInputs | None = None
        self._generator: torch.Generator | None = None
        self._last_stats: dict[str, Tensor] = {}
        self._warned_labels = False
        self.embedding_dimension = self._model_embedding_dimension(model)
        tag_model_card(model)
        self.init_queue(name, model, guide, options.queue)

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

    def check_logit_range(self, max_abs_similarity: float) -> None:
        """Raise if ``max_abs_similarity / temperature`` overflows (e.g. ``1 + m`` for Focal-InfoNCE logits)."""
        if self.similarity_fct_name == "cos_sim":
            validation.check_temperature(self.temperature, "temperature", max_abs_similarity)

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
                whole = self.prepare_batch(embeddings, labels)
                return self.reduce(self.whole_batch_rows(whole), whole)
            finally:
                self.close_batch()
        try:
            batch = self.begin_batch(self.prepare_batch(embeddings, labels, own_rows=True))
            loss = self.reduce(self.window_rows(batch), batch)
            self.end_batch(batch)
            return loss
        finally:
            self.close_batch()

    def whole_batch_rows(self, batch: Batch) -> Tensor:
        """The (N,) rows of a loss computed whole (every row of the gathered batch), when it has no
        :meth:`window_rows` for chunks of rows (MixCSE's official layout)."""
        raise NotImplementedError(f"{type(self).__name__} computes its rows with window_rows")

    # ------------------------------------------------------------------ shared machinery
    def generator(self, device: torch.device | str) -> torch.Generator | None:
        """The random source of the loss's random draws on ``device``: a generator seeded with ``seed``, created
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

    def record_stats(self, batch: Batch, cos: Tensor, num_in_batch: int, num_synthetic: int = 0,
                     extra: dict[str, Tensor] | None = None, row_offset: int = 0) -> None:
        """Remember the batch's mean cosines (and ``extra`` scalars) for :attr:`diagnostics` (no gradient, no device
        sync), with the false-negative and queue counts of ``batch``'s rows. ``row_offset``: the batch index of
        ``cos``'s first row (a chunk of anchors)."""
        stats = fn.contrastive_stats(cos.detach(), num_in_batch, num_synthetic, row_offset=row_offset)
        stats.update(batch.state.false_negative_stats)
        stats.update(batch.state.queue_stats)
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
        return {**out, **self.queue_diagnostics()}

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
        config.update(self.queue_config())
        if self.guide is not None:
            card = getattr(self.guide, "model_card_data", None)
            config["guide"] = getattr(card, "base_model", None) or type(self.guide).__name__
        return {**config, "gather_across_devices": self.gather_across_devices,
                "mini_batch_size": self.mini_batch_size, "mini_batch_num_tokens": self.mini_batch_num_tokens}
