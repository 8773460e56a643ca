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


class HardNegativeLoss(nn.Module):
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
    """

    #: smallest batch the loss accepts (in-batch mixing needs a partner)
    min_batch_size: int = 2
    #: whether the loss reads labels (the st-hardneg losses do not; a labelled dataset triggers a warning)
    uses_labels: bool = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        method = cls.__dict__.get("compute_loss_from_embeddings")
        if method is None or getattr(method, "_float32_loss", False):
            return

        @functools.wraps(method)
        def compute_loss_from_embeddings(self, embeddings, labels=None, *args, **kw):
            self.check_labels(labels)
            with fn.autocast_disabled(embeddings):
                return method(self, embeddings, labels, *args, **kw)

        compute_loss_from_embeddings._float32_loss = True
        cls.compute_loss_from_embeddings = compute_loss_from_embeddings

    def __init__(self, model: nn.Module, temperature: float = 0.05, seed: int | None = None) -> None:
        super().__init__()
        self.model = model
        self.temperature = validation.check_temperature(temperature)
        self.seed = validation.check_seed(seed)
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
        embeddings = embed_columns(self.model, sentence_features)
        return self.compute_loss_from_embeddings(embeddings, labels)

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
        negatives = torch.cat(units[2:], dim=0) if len(units) > 2 else units[0].new_zeros((0, width))
        return Batch(units[0], units[1], negatives, raw_anchors=raw[0], raw_positives=raw[1])

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
        return type(getattr(self.model, "forward", None)).__name__ == "ForwardDecorator"

    def split_batch(self, embeddings: list[Tensor]) -> Batch:
        """Backwards-compatible alias of :meth:`prepare_batch` (without labels)."""
        return self.prepare_batch(embeddings)

    # ------------------------------------------------------------------ shared machinery
    def generator(self, device: torch.device | str) -> torch.Generator | None:
        """The random source of the loss's random draws on ``device``: a generator seeded with :attr:`seed`, created
        at the first draw and kept (so it advances from batch to batch), or ``None`` (torch's global generator, seeded
        by the Trainer's ``seed``) if the loss has no seed. Every random draw of a loss goes through here."""
        if self.seed is None:
            return None
        device = torch.device(device)
        if self._generator is None or self._generator.device != device:
            self._generator = torch.Generator(device=device).manual_seed(self.seed)
        return self._generator

    def reduce(self, rows: Tensor) -> Tensor:
        """The loss of the batch from the (N,) per-anchor losses: their mean."""
        return rows.mean()

    def record_stats(self, cos: Tensor, num_in_batch: int, num_synthetic: int = 0,
                     extra: dict[str, Tensor] | None = None) -> None:
        """Remember the batch's mean cosines (and ``extra`` scalars) for :attr:`diagnostics` (no gradient, no device
        sync)."""
        stats = fn.contrastive_stats(cos.detach(), num_in_batch, num_synthetic)
        for key, value in (extra or {}).items():
            stats[key] = value.detach() if isinstance(value, Tensor) else torch.as_tensor(value)
        self._last_stats = stats

    @property
    def diagnostics(self) -> dict[str, float]:
        """Mean cosines of the last batch seen in training: ``positive``, ``negative`` and, for losses that
        synthesise negatives, ``synthetic`` (MixCSE Fig. 4a). Empty before the first batch."""
        return {key: float(value) for key, value in self._last_stats.items()}

    def get_config_dict(self) -> dict[str, Any]:
        return {"temperature": self.temperature}
