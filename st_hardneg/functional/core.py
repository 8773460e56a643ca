"""Cosine geometry, partners, logits and statistics shared by every st-hardneg loss.

Conventions: an anchor ``i`` always has its positive at candidate column ``i``; "shared" candidates are seen by every
anchor, "row" candidates (shape ``(N, S, d)``) only by their own anchor. Functions whose inputs must already be unit
rows say so; the losses normalise each embedding exactly once (:func:`normalize`) and pass the unit rows on.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import Any, Literal, TypeVar, cast

import torch
import torch.nn.functional as F
from torch import Tensor

PartnerMode = Literal["shift", "random", "hardest"]

#: the norm below which a row is scaled by ``1 / NORM_EPS`` instead of ``1 / ||x||``. It bounds the gradient of the
#: normalisation: ``||∂L/∂x|| <= ||∂L/∂x̂|| / NORM_EPS`` for every row, zero rows included.
NORM_EPS = 1e-6


_F = TypeVar("_F", bound=Callable[..., Any])


def autocast_disabled(tensors: Any) -> contextlib.AbstractContextManager:
    """A context that disables autocast on the device type of the first tensor in ``tensors`` (a tensor or a
    sequence), so the math inside runs in the dtype of its inputs (float32 here) under bf16/fp16 mixed precision."""
    if isinstance(tensors, list | tuple):
        tensors = next((t for t in tensors if isinstance(t, Tensor)), None)
    device_type = tensors.device.type if isinstance(tensors, Tensor) else "cpu"
    if torch.amp.is_autocast_available(device_type):
        return torch.autocast(device_type=device_type, enabled=False)
    return contextlib.nullcontext()


def float32_math(func: _F) -> _F:
    """Run ``func`` with autocast disabled on its first argument's device (its inputs are cast to float32 inside)."""

    @functools.wraps(func)
    def wrapper(first: Any, *args: Any, **kwargs: Any) -> Any:
        with autocast_disabled(first):
            return func(first, *args, **kwargs)

    return wrapper  # type: ignore[return-value]


def loss_precision(x: Tensor) -> Tensor:
    """``x`` in the precision of the loss math: float64 stays float64 (a double model's exact loss), every other
    dtype (float16, bfloat16 under mixed precision) becomes float32."""
    return x if x.dtype == torch.float64 else x.float()


def row_norms(x: Tensor) -> Tensor:
    """The L2 norm of every row (last dimension) of ``x`` in float32, without overflow or underflow.

    ``torch.linalg.vector_norm`` squares the entries, so in float32 a row with entries of 1e20 gets the norm ``inf``
    and a row of 1e-30 the norm 0. Dividing by the row's largest magnitude first (a constant for autograd: the norm is
    homogeneous, so the gradient is unchanged) keeps every representable norm exact. The result is ``inf`` only when
    the norm itself exceeds float32's range. Shape ``x.shape[:-1] + (1,)``. (float64 input: computed in float64.)
    """
    x = loss_precision(x)
    scale = x.detach().abs().amax(dim=-1, keepdim=True)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    return scale * torch.linalg.vector_norm(x / scale, dim=-1, keepdim=True)


class _Normalize(torch.autograd.Function):
    """``x / max(||x||, NORM_EPS)`` row by row, whose backward keeps only its output and the (N, 1) norms.

    Composed of autograd's own ops, the normalisation would keep an extra (N, d) tensor per call until the backward
    (``row_norms``' scaled copy of ``x``, which ``vector_norm`` saves). Its gradient needs none:
    ``∂L/∂x = (g - y (y·g)) / ||x||`` for a row above ``NORM_EPS`` (``y`` the output, ``g`` its gradient) and
    ``g / NORM_EPS`` below (a constant divisor), the same values up to rounding."""

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:  # type: ignore[override]
        norms = row_norms(x)
        divisor = norms.clamp_min(NORM_EPS)
        y = x / divisor
        ctx.save_for_backward(y, divisor, norms >= NORM_EPS)
        return y

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:  # type: ignore[override]
        y, divisor, above = ctx.saved_tensors
        radial = torch.where(above, y * (y * grad).sum(dim=-1, keepdim=True), torch.zeros_like(y))
        return (grad - radial) / divisor


def normalize(x: Tensor) -> Tensor:
    """L2-normalise the last dimension in float32: ``x / max(||x||, NORM_EPS)``.

    A zero row stays zero (cosine 0 with everything) and every row's gradient is bounded by ``1 / NORM_EPS`` times
    the upstream gradient. Normalise a tensor once: normalising an (almost) zero unit row again multiplies the bounds.
    Its backward holds no (N, d) tensor beyond the output (see :class:`_Normalize`), which is what keeps a cached
    loss's memory at CachedMNRL's.
    """
    x = loss_precision(x)
    if not x.requires_grad:
        return x / row_norms(x).clamp_min(NORM_EPS)
    return cast(Tensor, _Normalize.apply(x))


def mix(a: Tensor, b: Tensor, weight_a: float | Tensor, assume_normalized: bool = False) -> Tensor:
    """``normalize(weight_a · â + (1 - weight_a) · b̂)`` with â, b̂ the normalised inputs.

    Args:
        a: Tensor of shape (..., d).
        b: Tensor broadcastable to ``a``.
        weight_a: the weight of ``a``: a float, or a tensor broadcastable to ``a[..., :1]`` (one weight per mixture).
        assume_normalized: ``a`` and ``b`` are unit rows already (skip their normalisation).

    Returns:
        The normalised mixture, shape of ``a``. The weights act on directions, as in MixCSE's and HNCSE's equations.
    """
    if not assume_normalized:
        a, b = normalize(a), normalize(b)
    return normalize(weight_a * a + (1.0 - weight_a) * b)


def offdiagonal_mask(n: int, device: torch.device | str | None = None) -> Tensor:
    """Boolean (n, n) mask that is True off the diagonal: the in-batch negatives of each anchor."""
    return ~torch.eye(n, dtype=torch.bool, device=device)


def random_derangement(n: int, generator: torch.Generator | None = None,
                       device: torch.device | str | None = None) -> Tensor:
    """A random permutation without fixed points (a uniformly random single n-cycle).

    Built by walking a random ordering of the indices in a circle, so it costs one ``randperm``: no rejection
    sampling. Drawn on the generator's device, returned on ``device``.
    """
    if n < 2:
        raise ValueError(f"a derangement needs at least 2 elements, got {n}")
    order = torch.randperm(n, generator=generator, device=generator.device if generator else device)
    partner = torch.empty(n, dtype=torch.long, device=order.device)
    partner[order] = order.roll(-1)
    return partner.to(device) if device is not None else partner


def hardest_negatives(similarity: Tensor, k: int) -> Tensor:
    """Indices of the ``k`` most similar in-batch negatives of each anchor (diagonal excluded).

    Args:
        similarity: (n, ≥n) similarity of anchor ``i`` to candidate ``j``; the first n columns are the in-batch
            candidates, column ``i`` the positive of anchor ``i`` (never returned). Further columns are ignored.
        k: how many; must satisfy ``1 <= k <= n - 1``.

    Returns:
        LongTensor (n, k), hardest first.
    """
    n = similarity.size(0)
    if not 1 <= k <= n - 1:
        raise ValueError(f"k must be between 1 and the number of in-batch negatives ({n - 1}), got {k}")
    in_batch = similarity[:, :n].detach()
    masked = in_batch.masked_fill(~offdiagonal_mask(n, similarity.device), float("-inf"))
    return masked.topk(k, dim=1).indices


def partner_indices(
    n: int,
    mode: PartnerMode = "shift",
    similarity: Tensor | None = None,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
) -> Tensor:
    """Index of the in-batch negative that each anchor is mixed with; never the anchor itself.

    Args:
        n: batch size (at least 2).
        mode: ``"shift"``: ``j = i + 1 mod n`` (the MixCSE authors' code); ``"random"``: a random derangement drawn
            from ``generator``; ``"hardest"``: ``argmax_{j != i} similarity[i, j]``.
        similarity: (n, n) anchor-to-candidate similarity, required for ``"hardest"``.
        generator: random source for ``"random"`` (``None`` = torch's global generator).
        device: device of the result (default: the similarity's device, else the CPU).

    Returns:
        LongTensor of shape (n,).
    """
    if n < 2:
        raise ValueError(f"mixing with an in-batch negative needs a batch of at least 2, got {n}")
    if device is None and similarity is not None:
        device = similarity.device
    if mode == "shift":
        return (torch.arange(n, device=device) + 1) % n
    if mode == "random":
        return random_derangement(n, generator=generator, device=device)
    if mode == "hardest":
        if similarity is None or similarity.size(0) != n or similarity.size(1) < n:
            raise ValueError("partner='hardest' needs the (n, n) similarity matrix")
        return hardest_negatives(similarity, k=1).squeeze(1)
    raise ValueError(f"partner must be one of 'shift', 'random', 'hardest'; got {mode!r}")


def top_candidates(similarity: Tensor, k: int, exclude: Tensor) -> tuple[Tensor, Tensor]:
    """The ``k`` most similar candidates of each row that are not excluded.

    Args:
        similarity: (N, C) similarities (read without gradient).
        k: how many, ``1 <= k <= C``.
        exclude: (N, C) bool, True for candidates that may not be chosen (the positive, masked false negatives).

    Returns:
        ``(indices, valid)``: (N, k) LongTensor, most similar first, and (N, k) bool, False where a row has fewer than
        ``k`` allowed candidates (those positions point at excluded candidates and must not be used).
    """
    if not 1 <= k <= similarity.size(1):
        raise ValueError(f"k must be between 1 and the number of candidates ({similarity.size(1)}), got {k}")
    scores = similarity.detach().masked_fill(exclude, float("-inf"))
    values, indices = scores.topk(k, dim=1)
    return indices, values > float("-inf")


def allowed_partners(partners: Tensor, exclude: Tensor) -> tuple[Tensor, Tensor]:
    """Replace each excluded partner by the first allowed in-batch candidate after it, in cyclic order.

    Args:
        partners: (R,) proposed partner of each row (from ``"shift"`` or ``"random"``).
        exclude: (R, N) bool, True for the in-batch candidates that may not be partners (each row's own, masked false
            negatives); R = N for a whole batch, fewer for a chunk of its rows.

    Returns:
        ``(partners, valid)``: (R,) partners (unchanged where allowed) and (R,) bool, False for rows without any
        allowed candidate (their partner is meaningless).
    """
    n = exclude.size(1)
    order = (partners.unsqueeze(1) + torch.arange(n, device=partners.device).unsqueeze(0)) % n
    allowed = ~exclude.gather(1, order)
    first = allowed.to(torch.uint8).argmax(dim=1, keepdim=True)
    return order.gather(1, first).squeeze(1), allowed.any(dim=1)


def mask_columns(logits: Tensor, exclude: Tensor | None) -> Tensor:
    """``logits`` with the entries where ``exclude`` (its first columns; missing trailing columns are kept) is True
    set to ``-inf``: those candidates leave the softmax denominator."""
    if exclude is None:
        return logits
    if exclude.size(1) < logits.size(1):
        exclude = torch.cat([exclude, exclude.new_zeros(exclude.size(0), logits.size(1) - exclude.size(1))], dim=1)
    return logits.masked_fill(exclude, float("-inf"))


@float32_math
def candidate_cosines(anchors: Tensor, candidates: Tensor, row_candidates: Tensor | None = None,
                      assume_normalized: bool = False) -> Tensor:
    """Cosines of each anchor with the shared candidates and with its own row candidates.

    Args:
        anchors: (N, d).
        candidates: (C, d), seen by every anchor; anchor ``i``'s positive must be row ``i``.
        row_candidates: optional (N, S, d); ``row_candidates[i]`` are extra candidates of anchor ``i`` only
            (synthetic negatives).
        assume_normalized: every input is made of unit rows already (the losses' :class:`Batch`).

    Returns:
        (N, C + S) cosine matrix: shared columns first, then the S row columns.
    """
    if not assume_normalized:
        anchors, candidates = normalize(anchors), normalize(candidates)
    else:
        anchors, candidates = loss_precision(anchors), loss_precision(candidates)
        if row_candidates is not None:
            row_candidates = normalize(row_candidates)
    cos = anchors @ candidates.T
    if row_candidates is not None and row_candidates.size(1) > 0:
        if row_candidates.size(0) != anchors.size(0):
            raise ValueError(f"row_candidates has {row_candidates.size(0)} rows but there are {anchors.size(0)} anchors")
        cos = torch.cat([cos, torch.einsum("nd,nsd->ns", anchors, row_candidates)], dim=1)
    return cos


def contrastive_logits(
    cos: Tensor,
    temperature: float,
    focal_m: float | None = None,
    positive_columns: Tensor | None = None,
) -> Tensor:
    """Turn a cosine matrix into InfoNCE logits, optionally with the Focal-InfoNCE modulation.

    Plain: ``cos / τ``. Focal (Hou & Li 2023, Eq. 2): the positive ``s_p`` becomes ``s_p² / τ`` and every negative
    ``s_n`` becomes ``s_n (s_n + m) / τ``: hard negatives (large ``s_n``) are weighted up, easy ones down, and a
    positive that is not yet close is pushed harder.

    Args:
        cos: (N, K) cosines.
        temperature: τ > 0.
        focal_m: the focal margin ``m``; ``None`` = plain InfoNCE.
        positive_columns: (N,) column of each row's positive; default ``arange(N)``.

    Returns:
        (N, K) logits.
    """
    if focal_m is None:
        return cos / temperature
    n = cos.size(0)
    if positive_columns is None:
        positive_columns = torch.arange(n, device=cos.device)
    is_positive = torch.zeros_like(cos, dtype=torch.bool)
    is_positive[torch.arange(n, device=cos.device), positive_columns] = True
    return torch.where(is_positive, cos * cos, cos * (cos + focal_m)) / temperature


def info_nce_rows(logits: Tensor, positive_columns: Tensor | None = None) -> Tensor:
    """The (N,) cross-entropy of each row's logits with its positive column (default: the diagonal)."""
    if positive_columns is None:
        positive_columns = torch.arange(logits.size(0), device=logits.device)
    return F.cross_entropy(logits, positive_columns, reduction="none")


def info_nce(logits: Tensor, positive_columns: Tensor | None = None) -> Tensor:
    """Mean of :func:`info_nce_rows`."""
    return info_nce_rows(logits, positive_columns).mean()


@torch.no_grad()
def contrastive_stats(cos: Tensor, num_in_batch: int, num_synthetic: int = 0, row_offset: int = 0) -> dict[str, Tensor]:
    """Mean positive, in-batch negative and synthetic-negative cosine of a batch (MixCSE Fig. 4a).

    Args:
        cos: (N, K) cosines laid out as ``[in-batch candidates (num_in_batch) | other shared negatives | synthetic
            negatives (num_synthetic)]`` with the positive of row ``i`` at column ``i``.
        num_in_batch: number of in-batch candidate columns (N for pairs).
        num_synthetic: number of trailing synthetic columns.
        row_offset: the batch index of the first row (a chunk of anchors): row ``r``'s positive is at column
            ``row_offset + r``.

    Returns:
        Detached scalar tensors ``positive``, ``negative`` and, if there are synthetic columns, ``synthetic`` (kept as
        tensors so that reading them is the only device synchronisation).
    """
    n = cos.size(0)
    rows = torch.arange(n, device=cos.device)
    columns = rows + row_offset
    positives = cos[rows, columns]
    stats = {"positive": positives.mean()}
    # the in-batch negatives' mean: every in-batch entry but the positives (no mask, no boolean indexing: no device
    # sync, and it works on the meta device too)
    inside = (columns < num_in_batch).sum()
    count = n * num_in_batch - inside
    total = cos[:, :num_in_batch].sum() - torch.where(columns < num_in_batch, positives, 0.0).sum()
    stats["negative"] = total / count.clamp_min(1)
    if num_synthetic:
        stats["synthetic"] = cos[:, cos.size(1) - num_synthetic :].mean()
    return {k: v.detach() for k, v in stats.items()}
