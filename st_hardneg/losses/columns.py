"""The input check of every loss, as functions: the columns a loss receives, checked and converted to the loss's
dtype (:func:`checked_columns`), and their values (:func:`check_finite`).

This module imports nothing of :mod:`st_hardneg.losses.base`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from st_hardneg import functional as fn
from st_hardneg.losses.batch import column_name

__all__ = ["check_finite", "checked_columns"]


def checked_columns(embeddings: list[Tensor], *, name: str, min_batch_size: int, embedding_dimension: int | None,
                    in_matryoshka: Callable[[], bool]) -> list[Tensor]:
    """The columns in the loss math's dtype (float32, or float64 when a column is float64), before normalisation.

    Raises ``ValueError`` for fewer than 2 columns, columns that are not (batch, dim) tensors of one batch size
    and one width, a width that differs from ``embedding_dimension`` (unless ``in_matryoshka()``: MatryoshkaLoss
    truncates them; columns of another encoder are cut to the anchors' width as it does), a batch smaller than
    ``min_batch_size``, and NaN / inf entries or a norm beyond float32's range (naming the column); ``TypeError`` for
    a column that is not a tensor. ``name``: the loss's, for the messages.
    """
    embeddings = list(embeddings)
    if (len(embeddings) > 1 and isinstance(embeddings[0], Tensor) and embeddings[0].dim() == 2
            and any(isinstance(e, Tensor) and e.dim() == 2 and e.size(1) > embeddings[0].size(1)
                    for e in embeddings[1:]) and in_matryoshka()):
        # columns embedded by another module (AdCSE's key encoder) are not truncated by MatryoshkaLoss's
        # decorator: cut them to the anchors' width as it does (its normalisation follows below)
        width = embeddings[0].size(1)
        embeddings = [embeddings[0], *(e[:, :width] if e.size(1) > width else e for e in embeddings[1:])]
    if len(embeddings) < 2:
        raise ValueError(
            f"{name} needs at least 2 input columns, (anchor, positive[, negative_1, ...]), got {len(embeddings)}. "
            "For unsupervised SimCSE-style training pass every sentence twice: (sentence, sentence)."
        )
    for i, column in enumerate(embeddings):
        if not isinstance(column, Tensor):
            raise TypeError(f"{name}: compute_loss_from_embeddings takes torch tensors, one per column; column {i} "
                            f"({column_name(i)}) is a {type(column).__name__}" + (
                                " (convert it with torch.from_numpy)" if hasattr(column, "__array__") else ""))
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
    if embedding_dimension is not None and width != embedding_dimension and not in_matryoshka():
        raise ValueError(
            f"{name} was built for a model with {embedding_dimension}-dimensional embeddings but received "
            f"{width}-dimensional ones: the model's output size changed after the loss was created. Create the "
            "loss after the final model architecture is in place."
        )
    if n < min_batch_size:
        raise ValueError(
            f"{name} needs a batch of at least {min_batch_size} pairs (it uses other in-batch pairs as "
            f"negatives), got {n}. Increase the batch size or drop the last incomplete batch."
        )
    # the loss math in float32 (float16 / bfloat16 inputs are upcast), or float64 when a column is float64
    dtype = torch.float64 if any(column.dtype == torch.float64 for column in embeddings) else torch.float32
    raw = [column.to(dtype) for column in embeddings]
    for i, column in enumerate(raw):
        check_finite(column, i, name)
    return raw


def check_finite(column: Tensor, index: int, name: str) -> None:
    """Raise if ``column`` holds NaN / inf values or rows whose norm exceeds float32's range (naming the column)."""
    if column.device.type == "meta":
        return
    if not bool(torch.isfinite(column).all()):
        bad = (~torch.isfinite(column)).any(dim=1).nonzero().flatten().tolist()
        raise ValueError(
            f"{name}: the {column_name(index)} embeddings (column {index}) contain NaN or inf "
            f"values (rows {bad[:5]}{'...' if len(bad) > 5 else ''}). Check the model's output: an fp16 overflow "
            "or a diverged training run produces them."
        )
    norms = fn.row_norms(column.detach())
    if not bool(torch.isfinite(norms).all()):
        bad = (~torch.isfinite(norms)).flatten().nonzero().flatten().tolist()
        raise ValueError(
            f"{name}: the norm of the {column_name(index)} embeddings (column {index}, rows "
            f"{bad[:5]}) exceeds float32's range (3.4e38); the model's output has exploded."
        )


def model_embedding_dimension(model: Any) -> int | None:
    """The width of ``model``'s embeddings (``get_embedding_dimension`` or sentence-transformers' older name), or
    ``None`` for a model that cannot tell it (then the columns' width is not checked against it)."""
    for name in ("get_embedding_dimension", "get_sentence_embedding_dimension"):
        getter = getattr(model, name, None)
        if callable(getter):
            try:
                dim = getter()
            except Exception:  # a model that cannot tell its size: nothing to compare against
                return None
            return int(dim) if dim is not None else None
    return None


def in_matryoshka(loss: Any) -> bool:
    """Whether ``MatryoshkaLoss`` / ``Matryoshka2dLoss`` is calling ``loss`` with truncated embeddings: it decorates
    the model's ``forward`` with its ``ForwardDecorator`` for the duration of the call, or (GradCache) the loss's
    ``calculate_loss`` with its ``CachedLossDecorator``."""
    from sentence_transformers.sentence_transformer.losses.matryoshka import CachedLossDecorator, ForwardDecorator

    return (isinstance(getattr(loss.model, "forward", None), ForwardDecorator)
            or isinstance(loss.__dict__.get("calculate_loss"), CachedLossDecorator))
