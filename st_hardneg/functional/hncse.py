"""HNCSE's math (Liu et al. 2024): positive mixing (PM, §3.1) and hard-negative mixing (HNM, §3.2).

The public functions accept raw embeddings and normalise them; with ``assume_normalized=True`` they trust that their
inputs are unit rows (as :class:`~st_hardneg.losses.base.Batch` guarantees) and do not normalise them again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

from st_hardneg.functional.core import (
    NORM_EPS,
    float32_math,
    hardest_negatives,
    loss_precision,
    mix,
    normalize,
    top_candidates,
)
from st_hardneg.validation import check_weights_tensor

Alpha = float | Callable[[Tensor], Tensor | float]

#: names of the positive-mixing cases, indexed by the ``cases`` codes that :func:`positive_mixing` returns
PM_CASES = ("far", "near", "inverted", "unsafe")
PM_FAR, PM_NEAR, PM_INVERTED, PM_UNSAFE = range(4)


class PositiveMix(NamedTuple):
    """Result of :func:`positive_mixing` for a batch of N anchors."""

    #: (N, d) the new, normalised positives ``p_i`` (``ĥ'_i`` itself in the rows that are not mixed)
    positives: Tensor
    #: (N,) ``j*``: the hardest in-batch negative of each anchor
    partners: Tensor
    #: (N,) weight of ``ĥ'_i`` in the mix (1 where the row is not mixed)
    weights: Tensor
    #: (N,) long, the case of each row, an index into :data:`PM_CASES`
    cases: Tensor
    #: (N,) bool, rows whose positive was replaced by a mixture
    mixed: Tensor


def positive_mixing_weights(
    d1: Tensor, d2: Tensor, threshold: float, w1: float, w2: float, single: bool = False, weight_gradient: bool = False
) -> tuple[Tensor, Tensor, Tensor]:
    """The case and mixing weight of HNCSE's positive mixing (paper §3.1, Eq. 2) for each anchor.

    With ``d1 = cos(h_i, h'_i)``, ``d2 = cos(h_i, h'_j*)`` (``j*`` the hardest in-batch negative) and
    ``r = (d1 - d2) / d1``:

    - ``"unsafe"``: ``d1 <= 0`` or ``d1 + d2 <= 0``: keep ``h'_i`` (``r`` flips sign and the convex weights below stop
      being convex, so the printed equation would invert or blow up the positive);
    - ``"near"``: ``0 < r <= threshold``: weight ``w1 / (w1 + w2)`` on ``h'_i`` (the mix is re-normalised, so only the
      ratio of ``w1`` and ``w2`` matters);
    - ``"far"``: ``r > threshold``: keep ``h'_i``;
    - ``"inverted"``: ``d1 <= d2``: weight ``d1 / (d1 + d2)`` on ``h'_i`` and ``d2 / (d1 + d2)`` on ``h'_j*`` (the
      authors' code; the printed Eq. 2 has negative coefficients here). With ``single=True`` (the paper's
      HNCSE-PM_single ablation) these rows are kept as ``h'_i``.

    Args:
        d1, d2: (N,) cosines.
        threshold: the bound on ``r`` of the "near" case (paper: 0.1), >= 0.
        w1, w2: the weights of the "near" case, >= 0 with a positive sum.
        single: skip the "inverted" case.
        weight_gradient: keep the gradient of ``d1 / (d1 + d2)`` into ``d1`` and ``d2`` (the authors' code); else the
            weights are constants. The case selection never has a gradient.

    Returns:
        ``(weights, cases, mixed)``: (N,) float weight of ``h'_i`` (1 where not mixed), (N,) long case code (index into
        :data:`PM_CASES`), (N,) bool mask of the mixed rows.
    """
    d1, d2 = loss_precision(d1), loss_precision(d2)
    if not weight_gradient:
        d1, d2 = d1.detach(), d2.detach()
    c1, c2 = d1.detach(), d2.detach()
    safe = (c1 > 0) & (c1 + c2 > 0)
    inverted = safe & (c1 <= c2)
    ahead = safe & (c1 > c2)
    # r is only evaluated where d1 > 0; elsewhere the divisor is replaced to keep the tensor finite.
    r = (c1 - c2) / torch.where(safe, c1, torch.ones_like(c1))
    near = ahead & (r <= threshold)
    cases = torch.full_like(c1, PM_UNSAFE, dtype=torch.long)
    cases[ahead] = PM_FAR
    cases[near] = PM_NEAR
    cases[inverted] = PM_INVERTED
    mix_inverted = torch.zeros_like(inverted) if single else inverted
    convex = d1 / torch.where(mix_inverted, d1 + d2, torch.ones_like(d1))
    weights = torch.ones_like(d1)
    weights = torch.where(near, torch.full_like(d1, w1 / (w1 + w2)), weights)
    weights = torch.where(mix_inverted, convex, weights)
    return weights, cases, near | mix_inverted


@float32_math
def positive_mixing(
    anchors: Tensor,
    positives: Tensor,
    threshold: float,
    w1: float,
    w2: float,
    single: bool = False,
    detach_mix: bool = False,
    weight_gradient: bool = False,
    similarity: Tensor | None = None,
    assume_normalized: bool = False,
    exclude: Tensor | None = None,
    partners: Tensor | None = None,
    has_partner: Tensor | None = None,
) -> PositiveMix:
    """HNCSE's positive mixing (paper §3.1, Eq. 2): mix each positive with the anchor's hardest in-batch negative.

    ``j* = argmax_{j != i} cos(h_i, h'_j)``; the mixed rows get ``p_i = normalize(w·ĥ'_i + (1-w)·ĥ'_j*)`` with the
    weight ``w`` of :func:`positive_mixing_weights`; the other rows keep ``ĥ'_i``. The case selection and ``j*`` are
    constants; the weights too unless ``weight_gradient``.

    Args:
        anchors: (N, d) ``h``.
        positives: (N, d) ``h'``; row ``j`` is also the in-batch negative ``j`` of the other anchors.
        threshold, w1, w2, single, weight_gradient: see :func:`positive_mixing_weights`.
        detach_mix: no gradient through the mixed rows (the rows that are not mixed keep their gradient).
        similarity: the (N, ≥N) cosines ``ĥ_i · ĥ'_j`` if already computed (first N columns used).
        assume_normalized: ``anchors`` and ``positives`` are unit rows.
        exclude: optional (N, ≥N) bool mask of in-batch candidates that are not negatives (masked false negatives;
            first N columns used): ``j*`` is the hardest *unmasked* negative, and a row without one keeps ``ĥ'_i``
            (reported as the "unsafe", i.e. kept, case).
        partners, has_partner: the (N,) ``j*`` of every row and whether it has one, when already chosen (a loss
            that looks for them a chunk of rows at a time); then ``similarity`` and ``exclude`` are not used and
            ``d1``, ``d2`` are the rows' dot products.

    Returns:
        A :class:`PositiveMix`.
    """
    if not assume_normalized:
        anchors, positives = normalize(anchors), normalize(positives)
    n = anchors.size(0)
    if partners is not None:
        d1 = (anchors * positives).sum(-1)
        d2 = (anchors * positives[partners]).sum(-1)
    else:
        if similarity is None:
            similarity = anchors @ positives.T
        similarity = similarity[:, :n]
        has_partner = None
        if exclude is None:
            partners = hardest_negatives(similarity, k=1).squeeze(1)
        else:
            eye = torch.eye(n, dtype=torch.bool, device=similarity.device)
            partners, has_partner = top_candidates(similarity, 1, exclude[:, :n] | eye)
            partners, has_partner = partners.squeeze(1), has_partner.squeeze(1)
        rows = torch.arange(n, device=similarity.device)
        d1, d2 = similarity[rows, rows], similarity[rows, partners]
    weights, cases, mixed = positive_mixing_weights(d1, d2, threshold, w1, w2, single, weight_gradient)
    if has_partner is not None:
        mixed = mixed & has_partner
        weights = torch.where(has_partner, weights, torch.ones_like(weights))
        cases = torch.where(has_partner, cases, torch.full_like(cases, PM_UNSAFE))
    # only the mixed rows are mixed (a row's mixture reads only its own row): no (N, d) mixture, selection or their
    # gradients for the rows that keep their positive
    rows_mixed = mixed.nonzero().squeeze(1)
    mixture = mix(positives[rows_mixed], positives[partners[rows_mixed]], weights[rows_mixed].unsqueeze(1),
                  assume_normalized=True)
    if detach_mix:
        mixture = mixture.detach()
    return PositiveMix(positives.index_put((rows_mixed,), mixture), partners, weights, cases, mixed)


def compact_index_dtype(k: int) -> torch.dtype:
    """The narrowest integer dtype in which :func:`sample_distinct_pairs` can draw positions in ``[0, k)``: it adds
    two of them before the modulo, so it needs room for ``2k - 2``: ``torch.uint8`` up to k = 128, ``torch.int16`` up
    to 16,384, then ``torch.int32`` and ``torch.int64``."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    for dtype in (torch.uint8, torch.int16, torch.int32):
        if 2 * k - 2 <= torch.iinfo(dtype).max:
            return dtype
    return torch.int64


def sample_distinct_pairs(
    rows: int, k: int, num: int, generator: torch.Generator | None = None,
    device: torch.device | str | None = None, dtype: torch.dtype = torch.int64,
) -> tuple[Tensor, Tensor]:
    """``num`` ordered pairs ``(a, b)`` of distinct indices in ``[0, k)`` for each of ``rows`` rows.

    Uniform over the ``k (k-1)`` ordered pairs, drawn independently (with replacement across pairs), vectorised:
    ``a`` is uniform and ``b = (a + o) mod k`` with ``o`` uniform in ``[1, k)``.

    Args:
        rows, k, num: the shape of the draw: ``num`` pairs for each of ``rows`` rows, positions in ``[0, k)``.
        generator: the random source (its device is the draw's); else the global one on ``device``.
        device: where the pairs are returned.
        dtype: an integer dtype with room for ``2k - 2`` (:func:`compact_index_dtype` gives the narrowest). The draw
            is the same in every dtype (the generator gives the same numbers); a narrow one holds a fraction of
            int64's memory (uint8: an eighth) and never builds an int64 copy.

    Returns:
        Two tensors of shape (rows, num) and dtype ``dtype``.
    """
    if k < 2:
        raise ValueError(f"pairs of distinct indices need k >= 2, got {k}")
    if not isinstance(dtype, torch.dtype) or dtype.is_floating_point or dtype.is_complex or dtype == torch.bool:
        raise TypeError(f"dtype must be an integer torch.dtype, got {dtype!r}")
    if 2 * k - 2 > torch.iinfo(dtype).max:
        raise ValueError(f"dtype {dtype} cannot hold the sum of two positions < {k} ({2 * k - 2}); use "
                         f"compact_index_dtype(k) = {compact_index_dtype(k)} or wider")
    source = generator.device if generator is not None else device
    first = torch.randint(k, (rows, num), generator=generator, device=source, dtype=dtype)
    second = torch.randint(1, k, (rows, num), generator=generator, device=source, dtype=dtype)
    second.add_(first).remainder_(k)
    if device is not None:
        first, second = first.to(device), second.to(device)
    return first, second


def adaptive_alpha(cosine: Tensor) -> Tensor:
    """An adaptive mixing weight for HNCSE's hard-negative mixing (paper Eq. 8): ``α = (3 - c) / 4``.

    ``c = cos(G_a, G_b)`` ∈ [-1, 1] is mapped linearly to ``α`` ∈ [0.5, 1]. Two near-duplicate negatives (``c → 1``)
    are mixed evenly; as they diverge the mix leans towards ``G_a``. The reason: the normalised mix of two unit vectors
    is ``(α G_a + (1-α) G_b) / ρ`` with ``ρ² = α² + (1-α)² + 2α(1-α)c``, so its cosine with the anchor is the weighted
    cosine divided by ``ρ``. An even mix of dissimilar negatives has a small ``ρ`` (0.71 at ``c = 0``, 0 at
    ``c = -1``): it is artificially harder than both parents (up to a false positive) or, for opposite parents, an
    arbitrary direction. ``α = (3 - c) / 4`` keeps ``ρ >= 0.79`` for ``c >= 0`` and ``ρ = 1`` at ``c = -1``, so the
    synthetic negative stays "neither too similar nor too dissimilar" (§3.2).
    """
    return (3.0 - cosine.clamp(-1.0, 1.0)) / 4.0


#: adaptive α functions accepted by name
ALPHA_FUNCTIONS: dict[str, Callable[[Tensor], Tensor]] = {"adaptive": adaptive_alpha}


def alpha_weights(alpha: Alpha, pair_cosines: Tensor) -> Tensor | float:
    """The weight of ``G_a``: the float ``alpha``, or ``alpha(cos(G_a, G_b))`` evaluated without gradient and checked
    to lie in [0, 1] (a ``ValueError`` otherwise: a weight outside it extrapolates instead of mixing)."""
    if not callable(alpha):
        return float(alpha)
    with torch.no_grad():
        value = alpha(pair_cosines.detach())
        weight = torch.as_tensor(value, dtype=pair_cosines.dtype, device=pair_cosines.device)
    return check_weights_tensor(weight, "alpha")


def hard_negative_pairs(hard: Tensor, num_mixed: int, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
    """The two parents of each of ``num_mixed`` mixtures per row: pairs of distinct positions drawn by
    :func:`sample_distinct_pairs` among the ``k`` columns of ``hard``, returned as indices into the pool.

    Args:
        hard: (N, k) LongTensor, the hard negatives of each row (indices into the pool), ``k >= 2``.
        num_mixed: ``m``, the number of mixtures per row.
        generator: random source (``None``: torch's global generator).

    Returns:
        Two LongTensors (N, m): the pool indices of ``G_a`` and ``G_b``.
    """
    n, k = hard.shape
    first, second = sample_distinct_pairs(n, k, num_mixed, generator=generator, device=hard.device)
    return hard.gather(1, first), hard.gather(1, second)


@float32_math
def mix_hard_negatives(
    pool: Tensor, hard: Tensor, num_mixed: int, alpha: Alpha = 0.5, generator: torch.Generator | None = None,
    assume_normalized: bool = False,
) -> Tensor:
    """HNCSE's hard-negative mixing (paper §3.2, Eq. 7-8): ``num_mixed`` mixtures of pairs of hard negatives per row.

    For row ``i`` and each of ``num_mixed`` pairs ``(a, b)`` of distinct positions drawn by
    :func:`sample_distinct_pairs`: ``u = normalize(α·Ĝ_a + (1-α)·Ĝ_b)`` with ``G = pool[hard[i]]``.

    Args:
        pool: (C, d) the vectors the indices point into.
        hard: (N, k) LongTensor, the hard negatives of each row (indices into ``pool``), ``k >= 2``.
        num_mixed: ``m``, the number of mixtures per row.
        alpha: the weight of ``G_a``: a float in [0, 1], or a function of the (N, m) tensor ``cos(G_a, G_b)`` returning
            weights in [0, 1] (a tensor broadcastable to (N, m), or a float), evaluated without gradient.
        generator: random source of the pairs (``None``: torch's global generator).
        assume_normalized: ``pool`` is made of unit rows.

    Returns:
        (N, num_mixed, d) normalised mixtures. Gradients flow into ``pool`` (detach the result to stop them).
    """
    unit = pool if assume_normalized else normalize(pool)
    parents_a, parents_b = hard_negative_pairs(hard, num_mixed, generator=generator)
    g_a, g_b = unit[parents_a], unit[parents_b]
    weight = alpha_weights(alpha, (g_a * g_b).sum(-1))
    if isinstance(weight, Tensor) and weight.dim() > 0:
        weight = weight.unsqueeze(-1)
    return mix(g_a, g_b, weight, assume_normalized=True)


@float32_math
def hard_negative_mixing(
    anchors: Tensor, pool: Tensor, k: int, num_mixed: int, alpha: Alpha = 0.5,
    generator: torch.Generator | None = None, single: bool = False,
) -> Tensor:
    """Synthetic hard negatives of each anchor from its top-``k`` in-batch negatives (HNCSE §3.2).

    The top-``k`` negatives of anchor ``i`` are the ``k`` rows ``j != i`` of ``pool`` (its in-batch candidates,
    ``pool[i]`` being its positive) with the largest ``cos(h_i, pool_j)``.

    Args:
        anchors: (N, d).
        pool: (N, d) in-batch candidates, row ``i`` the positive of anchor ``i``.
        k: how many hard negatives, ``1 <= k <= N - 1`` (``>= 2`` unless ``single``).
        num_mixed, alpha, generator: see :func:`mix_hard_negatives`.
        single: the HNCSE-HNM_single ablation: return the top-``k`` negatives themselves (hardest first) instead of
            ``num_mixed`` mixtures.

    Returns:
        (N, k, d) if ``single`` else (N, num_mixed, d), normalised.
    """
    a, unit = normalize(anchors), normalize(pool)
    hard = hardest_negatives(a @ unit.T, k)
    if single:
        return unit[hard]
    return mix_hard_negatives(unit, hard, num_mixed, alpha=alpha, generator=generator, assume_normalized=True)


@float32_math
def mixed_negative_cosines(
    anchors: Tensor, pool: Tensor, parents_a: Tensor, parents_b: Tensor, alpha: Alpha = 0.5,
    detach_pool: bool = False, similarity: Tensor | None = None, assume_normalized: bool = False,
) -> Tensor:
    """``cos(h_i, u_ij)`` for the mixtures ``u_ij = normalize(α·Ĝ_a + (1-α)·Ĝ_b)`` of :func:`mix_hard_negatives`,
    from the (N, C) anchor-pool cosines and the parents' dot products instead of the (N, m, d) mixtures:
    ``u·ĥ = (α ĥ·Ĝ_a + (1-α) ĥ·Ĝ_b) / ||α Ĝ_a + (1-α) Ĝ_b||`` with
    ``||·||² = α² Ĝ_a·Ĝ_a + (1-α)² Ĝ_b·Ĝ_b + 2α(1-α) Ĝ_a·Ĝ_b``.

    Mathematically identical to ``einsum("nd,nmd->nm", normalize(anchors), mix_hard_negatives(...))`` with the same
    parents (zero vectors included: their mixture has cosine 0), gradients included, at a fraction of the cost.

    Args:
        anchors: (N, d).
        pool: (C, d) the vectors the parent indices point into.
        parents_a, parents_b: (N, m) LongTensors from :func:`hard_negative_pairs`.
        alpha: as in :func:`mix_hard_negatives`.
        detach_pool: no gradient through the mixtures into ``pool`` (HNCSE's ``hnm_gradient=False``).
        similarity: the (N, C) cosines ``ĥ · Ĝ`` if already computed (ignored when ``detach_pool``, which needs them
            without gradient into the pool).
        assume_normalized: ``anchors`` and ``pool`` are unit rows.

    Returns:
        (N, m) cosines.
    """
    a, unit = (anchors, pool) if assume_normalized else (normalize(anchors), normalize(pool))
    if detach_pool:
        unit = unit.detach()
        similarity = None
    sim = a @ unit.T if similarity is None else similarity[:, : unit.size(0)]
    # only the Gram entries the mixtures need (not the (C, C) matrix): O(N·m·d) whatever the pool's size
    g_a, g_b = unit[parents_a], unit[parents_b]
    g_ab = (g_a * g_b).sum(-1)
    weight = alpha_weights(alpha, g_ab)
    numerator = weight * sim.gather(1, parents_a) + (1.0 - weight) * sim.gather(1, parents_b)
    squared_norm = (weight * weight * (g_a * g_a).sum(-1) + (1.0 - weight) ** 2 * (g_b * g_b).sum(-1)
                    + 2.0 * weight * (1.0 - weight) * g_ab)
    # normalize() divides by max(||x||, NORM_EPS); clamping the square first keeps sqrt's gradient finite at 0
    return numerator / squared_norm.clamp_min(NORM_EPS * NORM_EPS).sqrt()


@float32_math
def hard_negative_mixing_cosines(
    anchors: Tensor, pool: Tensor, k: int, num_mixed: int, alpha: Alpha = 0.5,
    generator: torch.Generator | None = None, detach_pool: bool = False, similarity: Tensor | None = None,
    assume_normalized: bool = False,
) -> Tensor:
    """The (N, num_mixed) cosines of each anchor with its synthetic hard negatives from :func:`hard_negative_mixing`
    (same random draws for the same generator state), without building the mixtures; see
    :func:`mixed_negative_cosines`. ``similarity``: the (N, ≥N) anchor-pool cosines if already computed."""
    a, unit = (anchors, pool) if assume_normalized else (normalize(anchors), normalize(pool))
    if similarity is None:
        similarity = a @ unit.T
    hard = hardest_negatives(similarity, k)
    parents_a, parents_b = hard_negative_pairs(hard, num_mixed, generator=generator)
    return mixed_negative_cosines(a, unit, parents_a, parents_b, alpha=alpha, detach_pool=detach_pool,
                                  similarity=similarity, assume_normalized=True)
