"""What every st-hardneg loss shares: input checking, the float32 batch, the ST forward, random draws, reduction and
the diagnostics it records."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from sentence_transformers.base.losses.merged_forward import embed_columns
from torch import Tensor, nn

from st_hardneg import functional as fn
from st_hardneg import validation
from st_hardneg.losses import distributed as dist
from st_hardneg.losses.false_negatives import FalseNegativeControl, text_keys  # noqa: F401  (text_keys re-exported)
from st_hardneg.losses.gradcache import GradCacheMixin, check_cacheable_model, check_mini_batch_size


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


def column_name(index: int) -> str:
    """``anchor``, ``positive``, ``negative_1``, ... for input column ``index``."""
    return ("anchor", "positive")[index] if index < 2 else f"negative_{index - 1}"


class HardNegativeLoss(FalseNegativeControl, GradCacheMixin, nn.Module):
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
    (:func:`st_hardneg.losses.distributed.shared_seed`). All processes must hold the same local batch size (use
    ``dataloader_drop_last=True``); a ragged batch raises. Without a process group the option changes nothing but the
    random source of the draws.

    ``mini_batch_size`` / ``mini_batch_num_tokens``: GradCache (Gao et al., 2021) through sentence-transformers'
    ``CachedLossMixin`` (:class:`st_hardneg.losses.gradcache.GradCacheMixin`): the encoder sees only mini-batches of that
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
