"""What every st-hardneg loss shares: input checking, the ST forward, and the diagnostics it records."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from sentence_transformers.base.losses.merged_forward import embed_columns
from torch import Tensor, nn

from st_hardneg import functional as fn


def check_temperature(value: float, name: str = "temperature") -> float:
    """Return ``value`` as a float if it is a usable temperature (> 0, finite), else raise ``ValueError``."""
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a positive number, got {value!r}") from None
    if not value > 0 or value != value or value == float("inf"):
        raise ValueError(f"{name} must be a positive, finite number, got {value!r}")
    return value


def check_focal_m(value: float | None) -> float | None:
    """``None`` disables the focal modulation; otherwise ``m`` must be a finite number >= 0."""
    if value is None:
        return None
    value = float(value)
    if not value >= 0 or value == float("inf"):
        raise ValueError(f"focal_m (the Focal-InfoNCE margin m) must be >= 0 and finite, got {value!r}")
    return value


@dataclass
class Batch:
    """The normalised float32 embeddings of one training batch, split by role.

    ``anchors`` (N, d), ``positives`` (N, d) and ``negatives`` (N·k, d): the k explicit negative columns
    stacked column after column (as sentence-transformers orders its candidate columns).
    """

    anchors: Tensor
    positives: Tensor
    negatives: Tensor

    @property
    def size(self) -> int:
        return self.anchors.size(0)

    @property
    def candidates(self) -> Tensor:
        """Shared candidates of the anchor → positive direction: in-batch positives, then explicit negatives."""
        if self.negatives.size(0) == 0:
            return self.positives
        return torch.cat([self.positives, self.negatives], dim=0)


class HardNegativeLoss(nn.Module):
    """Base class of the st-hardneg losses.

    Subclasses implement :meth:`compute_loss_from_embeddings`; this class provides the sentence-transformers
    ``forward`` (one embedding per input column, merged forwards where ST can), the checks that every loss
    makes on its input, and :attr:`diagnostics`, the mean positive / negative / synthetic cosines of the last
    training batch.
    """

    #: smallest batch the loss accepts (in-batch mixing needs a partner)
    min_batch_size: int = 2

    def __init__(self, model: nn.Module, temperature: float = 0.05) -> None:
        super().__init__()
        self.model = model
        self.temperature = check_temperature(temperature)
        self._last_stats: dict[str, Tensor] = {}

    # sentence-transformers' losses expose `scale = 1 / temperature`; offer the same for familiarity.
    @property
    def scale(self) -> float:
        return 1.0 / self.temperature

    def forward(self, sentence_features: Iterable[dict[str, Tensor]], labels: Tensor | None) -> Tensor:
        embeddings = embed_columns(self.model, sentence_features)
        return self.compute_loss_from_embeddings(embeddings, labels)

    def compute_loss_from_embeddings(self, embeddings: list[Tensor], labels: Tensor | None) -> Tensor:
        raise NotImplementedError

    def split_batch(self, embeddings: list[Tensor]) -> Batch:
        """Check the columns and return them normalised in float32 as a :class:`Batch`."""
        embeddings = list(embeddings)
        name = type(self).__name__
        if len(embeddings) < 2:
            raise ValueError(
                f"{name} needs at least 2 input columns, (anchor, positive[, negative_1, ...]), got {len(embeddings)}. "
                "For unsupervised SimCSE-style training pass every sentence twice: (sentence, sentence)."
            )
        n = embeddings[0].size(0)
        for i, column in enumerate(embeddings):
            if column.dim() != 2 or column.size(0) != n:
                raise ValueError(
                    f"{name}: every column must be a (batch, dim) tensor with the same batch size; "
                    f"column 0 has shape {tuple(embeddings[0].shape)}, column {i} has {tuple(column.shape)}"
                )
        if n < self.min_batch_size:
            raise ValueError(
                f"{name} needs a batch of at least {self.min_batch_size} pairs (it uses other in-batch pairs as "
                f"negatives), got {n}. Increase the batch size or drop the last incomplete batch."
            )
        anchors = fn.normalize(embeddings[0])
        positives = fn.normalize(embeddings[1])
        if len(embeddings) > 2:
            negatives = fn.normalize(torch.cat(embeddings[2:], dim=0))
        else:
            negatives = anchors.new_zeros((0, anchors.size(1)))
        return Batch(anchors, positives, negatives)

    def record_stats(self, cos: Tensor, num_in_batch: int, num_synthetic: int = 0) -> None:
        """Remember the batch's mean cosines for :attr:`diagnostics` (no gradient, no device sync)."""
        self._last_stats = fn.contrastive_stats(cos.detach(), num_in_batch, num_synthetic)

    @property
    def diagnostics(self) -> dict[str, float]:
        """Mean cosines of the last batch seen in training: ``positive``, ``negative`` and, for losses that
        synthesise negatives, ``synthetic`` (MixCSE Fig. 4a). Empty before the first batch."""
        return {key: float(value) for key, value in self._last_stats.items()}

    def get_config_dict(self) -> dict[str, Any]:
        return {"temperature": self.temperature}
