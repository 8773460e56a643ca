"""What every st-hardneg loss shares: input checking, the float32 batch, the ST forward, random draws, reduction and
the diagnostics it records."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from sentence_transformers.base.losses.merged_forward import embed_columns
from torch import Tensor, nn

from st_hardneg import distributed as dist
from st_hardneg import functional as fn
from st_hardneg import validation
from st_hardneg.gradcache import GradCacheMixin, check_cacheable_model, check_mini_batch_size


def check_temperature(value: float, name: str = "temperature") -> float:
    """Return ``value`` as a float if it is a usable temperature (> 0, finite), else raise ``ValueError``.
    (Kept for backwards compatibility; see :func:`st_hardneg.validation.check_temperature`.)"""
    return validation.check_temperature(value, name)


def check_focal_m(value: float | None) -> float | None:
    """``None`` disables the focal modulation; otherwise ``m`` must be a finite number >= 0."""
    return validation.check_optional_non_negative(value, "focal_m (the Focal-InfoNCE margin m)")


@dataclass
class Batch:
    """The embeddings of one training batch in float32, split by role.

    ``anchors`` (N, d), ``positives`` (N, d) and ``negatives`` (N·k, d) are unit rows (normalised exactly once, by
    :func:`st_hardneg.functional.normalize`); ``negatives`` stacks the k explicit negative columns column after column
    (as sentence-transformers orders its candidate columns). ``raw_anchors`` / ``raw_positives`` are the same rows
    before normalisation (float32), for methods defined on unnormalised vectors.
    """

    anchors: Tensor
    positives: Tensor
    negatives: Tensor
    raw_anchors: Tensor | None = None
    raw_positives: Tensor | None = None
    #: (num_columns, N) long text ids of every input row (equal id = identical text), when ``forward`` saw token ids
    text_keys: Tensor | None = None
    #: the guide model's unit embeddings of the same rows (a :class:`Batch`), when a ``guide`` is configured
    guide: Batch | None = None
    #: (N, N + N·k) bool, True where candidate ``c`` is a masked false negative of anchor ``i`` (never ``c == i``);
    #: ``None`` when false-negative control is off
    false_negatives: Tensor | None = None

    @property
    def size(self) -> int:
        return self.anchors.size(0)

    @property
    def device(self) -> torch.device:
        return self.anchors.device

    @property
    def candidates(self) -> Tensor:
        """Shared candidates of the anchor → positive direction: in-batch positives, then explicit negatives."""
        if self.negatives.size(0) == 0:
            return self.positives
        return torch.cat([self.positives, self.negatives], dim=0)


def text_keys(sentence_features: list[dict[str, Tensor]]) -> Tensor | None:
    """(num_columns, N) long ids of the rows' texts, equal for identical token ids under the attention mask (i.e.
    identical texts), compared across all columns; ``None`` if a column has no padded ``input_ids``.

    The id is the hash of the token-id tuple: Python hashes tuples of ints deterministically (no per-process
    randomisation, unlike strings), so ids from different processes can be compared after gathering."""
    keys = []
    for features in sentence_features:
        input_ids = features.get("input_ids") if isinstance(features, Mapping) else None  # dict or BatchEncoding
        if not isinstance(input_ids, Tensor) or input_ids.dim() != 2 or "cu_seq_lens_q" in features:
            return None
        attention = features.get("attention_mask")
        tokens = input_ids.tolist()
        if isinstance(attention, Tensor) and attention.shape == input_ids.shape:
            tokens = [[t for t, a in zip(row, keep, strict=True) if a]
                      for row, keep in zip(tokens, attention.tolist(), strict=True)]
        keys.append([hash(tuple(row)) for row in tokens])
    return torch.tensor(keys, dtype=torch.long)


def column_name(index: int) -> str:
    """``anchor``, ``positive``, ``negative_1``, ... for input column ``index``."""
    return ("anchor", "positive")[index] if index < 2 else f"negative_{index - 1}"


class HardNegativeLoss(GradCacheMixin, nn.Module):
    """Base class of the st-hardneg losses.

    Subclasses implement :meth:`compute_loss_from_embeddings` as::

        batch = self.prepare_batch(embeddings, labels)   # checks, float32, unit rows
        rows = ...                                       # (N,) loss of each anchor
        return self.reduce(rows)                         # the mean

    Every subclass's ``compute_loss_from_embeddings`` runs with autocast disabled (the loss math is float32 under
    bf16/fp16 mixed precision too) and warns once if it receives labels it does not use. This class also provides the
    sentence-transformers ``forward`` (one embedding per input column, merged forwards where ST can), the seeded
    random generator of the losses' random draws (:meth:`generator`), and :attr:`diagnostics`, the mean positive /
    negative / synthetic cosines of the last training batch.

    **Scaling up** (every loss takes both arguments):

    ``gather_across_devices=True`` (same name and meaning as in sentence-transformers, built on its
    ``all_gather_with_grad``): under ``torch.distributed``, :meth:`prepare_batch` gathers every input column of every
    process (with gradient), so everything that looks across the batch (in-batch negatives, mixing partners, hardest
    negatives, top-k pools, keys, the adversaries' gradient, the diagnostics) looks across the global batch. Design:
    every process computes the per-row losses of *all* ``W·n`` global rows (identical on every process) and
    :meth:`reduce` averages only its own ``n`` rows. Then the mean of the per-process losses is the single-process
    loss of the global batch, and since the gather's backward sums every process's gradient, distributed data
    parallel's average of the parameter gradients is exactly the single-process gradient. The cost is the loss math
    of the global batch on every process, ``O((W·n)²·d)``, which stays far below the encoder's cost for realistic
    batches. Random draws come from a generator that is identical on every process: the loss's own one when it has
    a ``seed`` (every process draws the same sequence), else one seeded per draw from rank 0's global RNG
    (:func:`st_hardneg.distributed.shared_seed`). All processes must hold the same local batch size (use
    ``dataloader_drop_last=True``); a ragged batch raises. Without a process group the option changes nothing but the
    random source of the draws.

    ``mini_batch_size`` / ``mini_batch_num_tokens``: GradCache (Gao et al., 2021) through sentence-transformers'
    ``CachedLossMixin`` (:class:`st_hardneg.gradcache.GradCacheMixin`): the encoder sees only mini-batches of that
    size (or token budget), in two passes, and the loss and gradients are those of the whole batch (the second pass
    replays the first pass's random state, so dropout masks match). ``compute_loss_from_embeddings`` runs once per
    batch, so every side effect (random draws, statistics, AdCSE's adversary gradient) happens once per batch, as
    without the cache. Composes with ``gather_across_devices``.
    """

    #: smallest batch the loss accepts (in-batch mixing needs a partner)
    min_batch_size: int = 2
    #: whether the loss reads labels (the st-hardneg losses do not; a labelled dataset triggers a warning)
    uses_labels: bool = False
    #: (this process's rows, global rows) after a gathering prepare_batch, else None
    _local_rows: tuple[slice, int] | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        method = cls.__dict__.get("compute_loss_from_embeddings")
        if method is None or getattr(method, "_float32_loss", False):
            return

        @functools.wraps(method)
        def compute_loss_from_embeddings(self, embeddings, labels=None, *args, **kw):
            self.check_labels(labels)
            try:
                with fn.autocast_disabled(embeddings):
                    return method(self, embeddings, labels, *args, **kw)
            finally:
                # what forward remembered for the false-negative mask serves this one call, also when it raised
                self._false_negative_inputs = None

        compute_loss_from_embeddings._float32_loss = True
        cls.compute_loss_from_embeddings = compute_loss_from_embeddings

    def __init__(self, model: nn.Module, temperature: float = 0.05, seed: int | None = None, *,
                 gather_across_devices: bool = False, mini_batch_size: int | None = None,
                 mini_batch_num_tokens: int | None = None) -> None:
        super().__init__()
        self.model = model
        self.temperature = validation.check_temperature(temperature)
        self.seed = validation.check_seed(seed)
        self.gather_across_devices = validation.check_bool(gather_across_devices, "gather_across_devices")
        self.mini_batch_size = check_mini_batch_size(mini_batch_size)
        self.mini_batch_num_tokens = check_mini_batch_size(mini_batch_num_tokens, "mini_batch_num_tokens")
        if self.uses_gradient_cache:
            if model is None:
                raise ValueError(f"{type(self).__name__}: mini_batch_size / mini_batch_num_tokens need a model to embed "
                                 "the mini-batches, got model=None")
            check_cacheable_model(model, type(self).__name__)
        self._local_rows: tuple[slice, int] | None = None
        self._generator: torch.Generator | None = None
        self._last_stats: dict[str, Tensor] = {}
        self._warned_labels = False
        self.embedding_dimension = self._model_embedding_dimension(model)

    @staticmethod
    def _model_embedding_dimension(model: Any) -> int | None:
        getter = getattr(model, "get_embedding_dimension", None)
        if callable(getter):
            try:
                dim = getter()
            except Exception:  # a model that cannot tell its size: nothing to compare against
                return None
            return int(dim) if dim is not None else None
        return None

    def check_logit_range(self, max_abs_similarity: float) -> None:
        """Raise if ``max_abs_similarity / temperature`` overflows (e.g. ``1 + m`` for Focal-InfoNCE logits)."""
        validation.check_temperature(self.temperature, "temperature", max_abs_similarity)

    # sentence-transformers' losses expose `scale = 1 / temperature`; offer the same for familiarity.
    @property
    def scale(self) -> float:
        return 1.0 / self.temperature

    def forward(self, sentence_features: Iterable[dict[str, Tensor]], labels: Tensor | None) -> Tensor:
        sentence_features = self.remember_false_negative_inputs(sentence_features)
        if self.uses_gradient_cache:
            return self.cached_forward(sentence_features, labels)
        embeddings = embed_columns(self.model, sentence_features)
        return self.compute_loss_from_embeddings(embeddings, labels)

    def scaling_config(self) -> dict[str, Any]:
        """The ``gather_across_devices`` / ``mini_batch_size`` / ``mini_batch_num_tokens`` part of the config."""
        return {"gather_across_devices": self.gather_across_devices, "mini_batch_size": self.mini_batch_size,
                "mini_batch_num_tokens": self.mini_batch_num_tokens}

    def compute_loss_from_embeddings(self, embeddings: list[Tensor], labels: Tensor | None) -> Tensor:
        raise NotImplementedError

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

    def prepare_batch(self, embeddings: list[Tensor], labels: Tensor | None = None) -> Batch:
        """Check the columns and return them in float32, normalised once, as a :class:`Batch`.

        Raises ``ValueError`` for fewer than 2 columns, columns that are not (batch, dim) tensors of one batch size
        and one width, a width that differs from the model's embedding dimension recorded at construction, a batch
        smaller than :attr:`min_batch_size`, and NaN / inf entries or a norm beyond float32's range (naming the
        column). Large but finite vectors (entries of 1e20, whose squares overflow) are normalised exactly.
        """
        self.check_labels(labels)
        embeddings = list(embeddings)
        name = type(self).__name__
        if len(embeddings) < 2:
            raise ValueError(
                f"{name} needs at least 2 input columns, (anchor, positive[, negative_1, ...]), got {len(embeddings)}. "
                "For unsupervised SimCSE-style training pass every sentence twice: (sentence, sentence)."
            )
        n = embeddings[0].size(0) if embeddings[0].dim() else 0
        for i, column in enumerate(embeddings):
            if not isinstance(column, Tensor) or column.dim() != 2 or column.size(0) != n:
                shape = tuple(column.shape) if isinstance(column, Tensor) else type(column).__name__
                raise ValueError(
                    f"{name}: every column must be a (batch, dim) tensor with the same batch size; "
                    f"column 0 (anchor) has shape {tuple(embeddings[0].shape)}, column {i} ({column_name(i)}) has {shape}"
                )
            if column.size(1) != embeddings[0].size(1):
                raise ValueError(
                    f"{name}: all columns must have the same embedding size; the anchor column has "
                    f"{embeddings[0].size(1)} dimensions, column {i} ({column_name(i)}) has {column.size(1)}"
                )
            if not column.is_floating_point():
                raise ValueError(f"{name}: column {i} ({column_name(i)}) must be a floating-point tensor, "
                                 f"got {column.dtype}")
        width = embeddings[0].size(1)
        if self.embedding_dimension is not None and width != self.embedding_dimension and not self._in_matryoshka():
            raise ValueError(
                f"{name} was built for a model with {self.embedding_dimension}-dimensional embeddings but received "
                f"{width}-dimensional ones: the model's output size changed after the loss was created. Create the "
                "loss after the final model architecture is in place."
            )
        if n < self.min_batch_size:
            raise ValueError(
                f"{name} needs a batch of at least {self.min_batch_size} pairs (it uses other in-batch pairs as "
                f"negatives), got {n}. Increase the batch size or drop the last incomplete batch."
            )
        raw = [column.float() for column in embeddings]
        units = []
        for i, column in enumerate(raw):
            norms = fn.row_norms(column)
            self._check_finite(column, norms, i)
            units.append(column / norms.clamp_min(fn.NORM_EPS))
        self._local_rows = None
        if self.gather_across_devices and dist.is_distributed():
            # Every column of every process, in rank order (with gradient), normalised again row by row (the same
            # float operations on the same rows); reduce() then averages this process's own rows.
            dist.check_equal_local_batches(n, raw[0].device)
            raw = [dist.gather_with_grad(column) for column in raw]
            units = [column / fn.row_norms(column).clamp_min(fn.NORM_EPS) for column in raw]
            self._local_rows = (dist.local_rows(n), raw[0].size(0))
        negatives = torch.cat(units[2:], dim=0) if len(units) > 2 else units[0].new_zeros((0, width))
        batch = Batch(units[0], units[1], negatives, raw_anchors=raw[0], raw_positives=raw[1])
        return self.attach_false_negatives(batch, len(embeddings))

    def _check_finite(self, column: Tensor, norms: Tensor, index: int) -> None:
        if column.device.type == "meta":
            return
        if not bool(torch.isfinite(column).all()):
            bad = (~torch.isfinite(column)).any(dim=1).nonzero().flatten().tolist()
            raise ValueError(
                f"{type(self).__name__}: the {column_name(index)} embeddings (column {index}) contain NaN or inf "
                f"values (rows {bad[:5]}{'...' if len(bad) > 5 else ''}). Check the model's output: an fp16 overflow "
                "or a diverged training run produces them."
            )
        if not bool(torch.isfinite(norms).all()):
            bad = (~torch.isfinite(norms)).flatten().nonzero().flatten().tolist()
            raise ValueError(
                f"{type(self).__name__}: the norm of the {column_name(index)} embeddings (column {index}, rows "
                f"{bad[:5]}) exceeds float32's range (3.4e38); the model's output has exploded."
            )

    def _in_matryoshka(self) -> bool:
        # MatryoshkaLoss truncates the model's output by decorating its forward for the duration of the call.
        # With GradCache it decorates this loss's calculate_loss instead (the forward hook runs after the patch).
        return (type(getattr(self.model, "forward", None)).__name__ == "ForwardDecorator"
                or type(self.__dict__.get("calculate_loss")).__name__ == "CachedLossDecorator")

    def split_batch(self, embeddings: list[Tensor]) -> Batch:
        """Backwards-compatible alias of :meth:`prepare_batch` (without labels)."""
        return self.prepare_batch(embeddings)

    # ------------------------------------------------------------------ false negatives
    #: mask candidates identical to the anchor's positive (embedding, or text when ``forward`` sees token ids)
    mask_duplicates: bool = False
    #: the positive-aware threshold's margin (``None``: off); see :meth:`configure_false_negatives`
    false_negative_margin: float | None = None
    margin_strategy: str = "absolute"
    guide: nn.Module | None = None

    def configure_false_negatives(self, mask_duplicates: bool = True, false_negative_margin: float | None = None,
                                  margin_strategy: str = "absolute", guide: nn.Module | None = None) -> None:
        """Set up false-negative control (called by each loss's constructor).

        Args:
            mask_duplicates: a candidate ``c`` other than anchor ``i``'s own positive is not a negative of anchor ``i``
                if its embedding is identical to the positive's, or, when the loss is called through ``forward`` on
                tokenised text, if its token ids under the attention mask (its text) are identical to the positive's.
            false_negative_margin: ``None`` (off) or a margin >= 0: candidate ``c`` of anchor ``i`` is masked when
                ``sim(i, c) > sim(i, i) - margin`` (``margin_strategy="absolute"``) or
                ``sim(i, c) > sim(i, i) - |sim(i, i)|·margin`` (``"relative"``), the false-negative filter of
                sentence-transformers' ``GISTEmbedLoss``. ``sim`` is the cosine of the guide's embeddings if a
                ``guide`` is given, else of the trained model's own (detached) embeddings.
            margin_strategy: ``"absolute"`` or ``"relative"``.
            guide: optional SentenceTransformer whose embeddings (computed without gradient in ``forward``) decide the
                threshold. If its tokenizer differs from the model's (or its ``max_seq_length`` is shorter), the
                model's token ids are decoded and re-tokenised for the guide. Needs ``false_negative_margin``.
        """
        self.mask_duplicates = validation.check_bool(mask_duplicates, "mask_duplicates")
        self.false_negative_margin = validation.check_optional_non_negative(
            false_negative_margin, "false_negative_margin")
        self.margin_strategy = validation.check_choice(margin_strategy, "margin_strategy", ("absolute", "relative"))
        self._must_retokenize = False
        if guide is not None:
            if self.false_negative_margin is None:
                raise ValueError("guide is only used by the false-negative threshold: also set false_negative_margin "
                                 "(e.g. 0.0 masks every candidate the guide finds closer than the positive)")
            if not isinstance(guide, nn.Module) or not callable(guide):
                raise ValueError(f"guide must be a SentenceTransformer model, got {type(guide).__name__}")
            model_tok, guide_tok = getattr(self.model, "tokenizer", None), getattr(guide, "tokenizer", None)
            if model_tok is None or guide_tok is None or not hasattr(model_tok, "get_vocab") or not hasattr(
                    guide_tok, "get_vocab"):
                raise ValueError("guide: the model and the guide must both have a Hugging Face tokenizer "
                                 "(`.tokenizer` with `get_vocab()`), to re-tokenise the texts for the guide if needed")
            self._must_retokenize = bool(
                model_tok.get_vocab() != guide_tok.get_vocab()
                or getattr(guide, "max_seq_length", 0) < getattr(self.model, "max_seq_length", 0))
            if self._must_retokenize and not hasattr(model_tok, "batch_decode"):
                raise ValueError("guide: the guide's tokenizer differs from the model's, and the model's tokenizer "
                                 "cannot decode token ids back to text (no batch_decode)")
        # kept out of the module tree (as AdCSE's key encoder): not trained, not in state_dict(), not in the optimizer
        vars(self)["guide"] = guide
        self._reports_false_negatives = False
        self._false_negative_inputs: dict[str, Any] | None = None
        self._false_negative_stats: dict[str, Tensor] = {}

    def false_negative_config(self) -> dict[str, Any]:
        """The false-negative options for :meth:`get_config_dict`: those that differ from their defaults (so the
        configuration of a loss that uses the defaults reads as before these options existed)."""
        config: dict[str, Any] = {}
        if not self.mask_duplicates:
            config["mask_duplicates"] = False
        if self.false_negative_margin is not None:
            config["false_negative_margin"] = self.false_negative_margin
            config["margin_strategy"] = self.margin_strategy
        if self.guide is not None:
            card = getattr(self.guide, "model_card_data", None)
            config["guide"] = getattr(card, "base_model", None) or type(self.guide).__name__
        return config

    @property
    def controls_false_negatives(self) -> bool:
        return self.mask_duplicates or self.false_negative_margin is not None

    def remember_false_negative_inputs(self, sentence_features: Iterable[dict[str, Tensor]]) -> list[dict[str, Tensor]]:
        """Called by ``forward`` before the model runs: keep each row's text key (for ``mask_duplicates``) and the
        guide's embeddings (computed without gradient) for the next :meth:`prepare_batch`. Returns the features."""
        sentence_features = list(sentence_features)
        inputs: dict[str, Any] = {}
        if self.mask_duplicates:
            inputs["text_keys"] = text_keys(sentence_features)
        if self.guide is not None:
            inputs["guide"] = self._guide_embeddings(sentence_features)
        self._false_negative_inputs = inputs or None
        return sentence_features

    def set_false_negative_inputs(self, text_keys: Tensor | None = None,
                                  guide_embeddings: list[Tensor] | None = None) -> None:
        """Provide the text keys ((num_columns, N) ids, equal = identical text) and/or the guide's embeddings (one
        (N, d') tensor per column) for the next :meth:`compute_loss_from_embeddings` call (``forward`` does this
        itself)."""
        inputs = {}
        if text_keys is not None:
            inputs["text_keys"] = torch.as_tensor(text_keys, dtype=torch.long)
        if guide_embeddings is not None:
            inputs["guide"] = [g.detach() for g in guide_embeddings]
        self._false_negative_inputs = inputs or None

    @torch.no_grad()
    def _guide_embeddings(self, sentence_features: list[dict[str, Tensor]]) -> list[Tensor]:
        from sentence_transformers.util import batch_to_device

        guide = self.guide
        device = getattr(guide, "device", None)
        if not self._must_retokenize:
            # shallow copies: the guide writes its outputs into the dicts it is given
            features = [dict(f) if device is None else batch_to_device(dict(f), device) for f in sentence_features]
            return embed_columns(guide, features)
        columns = []
        for features in sentence_features:
            if "input_ids" not in features or "cu_seq_lens_q" in features:
                raise ValueError("guide: re-tokenising for a guide with another tokenizer needs padded `input_ids` "
                                 "in the features")
            texts = self.model.tokenizer.batch_decode(features["input_ids"], skip_special_tokens=True)
            guide_features = batch_to_device(guide.preprocess(texts), device or features["input_ids"].device)
            columns.append(guide(guide_features)["sentence_embedding"])
        return columns

    def attach_false_negatives(self, batch: Batch, num_columns: int) -> Batch:
        """Attach the remembered text keys / guide embeddings to ``batch`` and compute its false-negative mask
        (:meth:`false_negative_mask`); records the masked counts for :attr:`diagnostics`."""
        inputs, self._false_negative_inputs = getattr(self, "_false_negative_inputs", None), None
        self._false_negative_stats = {}
        if not self.controls_false_negatives:
            return batch
        inputs = inputs or {}
        if getattr(self, "_local_rows", None) is not None:
            # gathered batch: the text keys and the guide's embeddings of every process, in rank order
            if inputs.get("text_keys") is not None:
                keys = inputs["text_keys"].to(batch.device)
                inputs["text_keys"] = dist.gather(keys.T.contiguous()).T
            if inputs.get("guide") is not None:
                inputs["guide"] = [dist.gather(g.to(batch.device)) for g in inputs["guide"]]
        keys = inputs.get("text_keys")
        if keys is not None:
            if tuple(keys.shape) != (num_columns, batch.size):
                raise ValueError(f"{type(self).__name__}: text keys of shape {tuple(keys.shape)} do not match the "
                                 f"batch ({num_columns} columns of {batch.size} rows)")
            batch.text_keys = keys.to(batch.device)
        if self.guide is not None or "guide" in inputs:
            guide = inputs.get("guide")
            if guide is None:
                raise ValueError(f"{type(self).__name__} has a guide model but received no guide embeddings: call the "
                                 "loss through forward(), or set_false_negative_inputs(guide_embeddings=...) first")
            if len(guide) != num_columns or any(g.size(0) != batch.size for g in guide):
                raise ValueError(f"{type(self).__name__}: the guide embeddings do not match the batch "
                                 f"({num_columns} columns of {batch.size} rows)")
            units = [fn.normalize(g.detach().to(batch.device)) for g in guide]
            negatives = torch.cat(units[2:]) if num_columns > 2 else units[0].new_zeros((0, units[0].size(1)))
            batch.guide = Batch(units[0], units[1], negatives)
        batch.false_negatives = self.false_negative_mask(batch)
        count = batch.false_negatives.sum(dim=1).float()
        # Reported once anything can be masked beyond exact duplicates (a threshold is set), or from the first batch
        # in which a duplicate was masked on: on duplicate-free data the default diagnostics stay as they were.
        if not self._reports_false_negatives and (
                self.false_negative_margin is not None or (count.device.type != "meta" and bool(count.any()))):
            self._reports_false_negatives = True
        if self._reports_false_negatives:
            self._false_negative_stats = {"masked_false_negatives": count.mean(),
                                          "masked_false_negatives_total": count.sum()}
        return batch

    @torch.no_grad()
    def false_negative_mask(self, batch: Batch) -> Tensor:
        """(N, N + N·k) bool: True where candidate ``c`` (``batch.candidates`` order) is not a negative of anchor
        ``i``: a duplicate of its positive (``mask_duplicates``) or above the positive-aware threshold
        (``false_negative_margin``). The positive column ``c == i`` is never masked."""
        n = batch.size
        candidates = batch.candidates.detach()
        mask = torch.zeros(n, candidates.size(0), dtype=torch.bool, device=batch.device)
        if self.mask_duplicates:
            rows = torch.cat([batch.positives.detach(), candidates])
            if rows.device.type != "meta":
                ids = torch.unique(rows, dim=0, return_inverse=True)[1]
                mask |= ids[:n].unsqueeze(1) == ids[n:].unsqueeze(0)
            if batch.text_keys is not None:
                keys = batch.text_keys
                candidate_keys = keys[1:].reshape(-1)  # positives, then negative_1, negative_2, ...
                mask |= keys[1].unsqueeze(1) == candidate_keys.unsqueeze(0)
        if self.false_negative_margin is not None:
            source = batch.guide if batch.guide is not None else batch
            sim = source.anchors.detach() @ source.candidates.detach().T
            positive = sim.diagonal().unsqueeze(1)
            margin = self.false_negative_margin
            threshold = positive - margin if self.margin_strategy == "absolute" else positive - positive.abs() * margin
            mask |= sim > threshold
        mask.fill_diagonal_(False)
        return mask

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
        """The loss of the batch from the (N,) per-anchor losses: their mean. After a gathering
        :meth:`prepare_batch`, ``rows`` covers the global batch and the mean is over this process's own rows."""
        if self._local_rows is not None:
            own, total = self._local_rows
            if rows.size(0) != total:
                raise ValueError(f"{type(self).__name__}.reduce: expected one loss per row of the gathered batch "
                                 f"({total}), got {rows.size(0)}")
            rows = rows[own]
        return rows.mean()

    def record_stats(self, cos: Tensor, num_in_batch: int, num_synthetic: int = 0,
                     extra: dict[str, Tensor] | None = None) -> None:
        """Remember the batch's mean cosines (and ``extra`` scalars) for :attr:`diagnostics` (no gradient, no device
        sync)."""
        stats = fn.contrastive_stats(cos.detach(), num_in_batch, num_synthetic)
        stats.update(getattr(self, "_false_negative_stats", {}))
        for key, value in (extra or {}).items():
            stats[key] = value.detach() if isinstance(value, Tensor) else torch.as_tensor(value)
        self._last_stats = stats

    @property
    def diagnostics(self) -> dict[str, float]:
        """Mean cosines of the last batch seen in training: ``positive``, ``negative`` and, for losses that
        synthesise negatives, ``synthetic`` (MixCSE Fig. 4a). Empty before the first batch. With false-negative
        control also ``masked_false_negatives`` (masked candidates per anchor, mean) and
        ``masked_false_negatives_total``: always when ``false_negative_margin`` is set, and from the first batch in
        which ``mask_duplicates`` masked something on."""
        return {key: float(value) for key, value in self._last_stats.items()}

    def get_config_dict(self) -> dict[str, Any]:
        return {"temperature": self.temperature}
