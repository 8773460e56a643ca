"""Shared math of the st-hardneg losses, written once and reused by every loss.

Every function here works on plain tensors and knows nothing about models, so each piece can be tested
against a hand computation:

- :func:`normalize`, :func:`cosine_matrix`: float32, zero-safe cosine geometry;
- :func:`mix`: convex mixing of embeddings followed by re-normalisation (MixCSE, HNCSE);
- :func:`partner_indices`: which in-batch negative to mix with (shift, random derangement, hardest);
- :func:`offdiagonal_mask`, :func:`hardest_negatives`: in-batch negative masks and top-k selection;
- :func:`candidate_cosines`: one cosine matrix over shared candidates plus per-anchor synthetic ones;
- :func:`contrastive_logits`: cosines → logits, optionally with the Focal-InfoNCE modulation;
- :func:`contrastive_stats`: the mean positive / negative / synthetic cosine of a batch (diagnostics).
- :func:`positive_mixing`: HNCSE's positive mixing (the positive mixed with the hardest negative);
- :func:`sample_distinct_pairs`, :func:`mix_hard_negatives`, :func:`hard_negative_mixing`, :func:`adaptive_alpha`:
  HNCSE's synthetic hard negatives, mixtures of pairs among each anchor's top-k negatives.

Conventions: an anchor ``i`` always has its positive at candidate column ``i``; "shared" candidates are
seen by every anchor, "row" candidates (shape ``(N, S, d)``) only by their own anchor.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

PartnerMode = Literal["shift", "random", "hardest"]

_EPS = 1e-8


def normalize(x: Tensor) -> Tensor:
    """L2-normalise the last dimension in float32.

    The loss math always runs in float32, also under bf16/fp16 autocast, so that ``cos²`` and
    ``exp(cos / 0.05)`` do not lose their precision. A zero vector stays a zero vector (cosine 0 with
    everything) instead of becoming NaN.
    """
    return F.normalize(x.float(), p=2, dim=-1, eps=_EPS)


def cosine_matrix(a: Tensor, b: Tensor) -> Tensor:
    """Cosine similarity of every row of ``a`` (N, d) with every row of ``b`` (M, d): shape (N, M)."""
    return normalize(a) @ normalize(b).T


def mix(a: Tensor, b: Tensor, weight_a: float | Tensor) -> Tensor:
    """``normalize(weight_a · â + (1 - weight_a) · b̂)`` with â, b̂ the normalised inputs.

    Args:
        a: Tensor of shape (..., d).
        b: Tensor broadcastable to ``a``.
        weight_a: the weight of ``a``: a float, or a tensor broadcastable to ``a[..., :1]`` (one weight per
            mixture).

    Returns:
        The normalised mixture, shape of ``a``. Inputs are normalised first, so the weights act on
        directions, as in MixCSE's and HNCSE's equations.
    """
    mixed = weight_a * normalize(a) + (1.0 - weight_a) * normalize(b)
    return normalize(mixed)


def offdiagonal_mask(n: int, device: torch.device | str | None = None) -> Tensor:
    """Boolean (n, n) mask that is True off the diagonal: the in-batch negatives of each anchor."""
    return ~torch.eye(n, dtype=torch.bool, device=device)


def random_derangement(n: int, generator: torch.Generator | None = None, device=None) -> Tensor:
    """A random permutation without fixed points (a uniformly random single n-cycle).

    Built by walking a random ordering of the indices in a circle, so it costs one ``randperm``: no
    rejection sampling.
    """
    if n < 2:
        raise ValueError(f"a derangement needs at least 2 elements, got {n}")
    order = torch.randperm(n, generator=generator, device=generator.device if generator else device)
    partner = torch.empty(n, dtype=torch.long, device=order.device)
    partner[order] = order.roll(-1)
    return partner.to(device) if device is not None else partner


def partner_indices(
    n: int,
    mode: PartnerMode = "shift",
    similarity: Tensor | None = None,
    generator: torch.Generator | None = None,
    device=None,
) -> Tensor:
    """Index of the in-batch negative that each anchor is mixed with; never the anchor itself.

    Args:
        n: batch size (at least 2).
        mode: ``"shift"``: ``j = i + 1 mod n`` (the MixCSE authors' code); ``"random"``: a random derangement
            drawn from ``generator``; ``"hardest"``: ``argmax_{j != i} similarity[i, j]``.
        similarity: (n, n) anchor-to-candidate similarity, required for ``"hardest"``.
        generator: random source for ``"random"`` (``None`` = torch's global generator).
        device: device of the result.

    Returns:
        LongTensor of shape (n,).
    """
    if n < 2:
        raise ValueError(f"mixing with an in-batch negative needs a batch of at least 2, got {n}")
    if mode == "shift":
        return (torch.arange(n, device=device) + 1) % n
    if mode == "random":
        return random_derangement(n, generator=generator, device=device)
    if mode == "hardest":
        if similarity is None or similarity.shape[:2] != (n, n):
            raise ValueError("partner='hardest' needs the (n, n) similarity matrix")
        return hardest_negatives(similarity, k=1).squeeze(1)
    raise ValueError(f"partner must be one of 'shift', 'random', 'hardest'; got {mode!r}")


def hardest_negatives(similarity: Tensor, k: int) -> Tensor:
    """Indices of the ``k`` most similar in-batch negatives of each anchor (diagonal excluded).

    Args:
        similarity: (n, n) similarity of anchor ``i`` to in-batch candidate ``j``; column ``i`` is the
            positive of anchor ``i`` and is never returned.
        k: how many; must satisfy ``1 <= k <= n - 1``.

    Returns:
        LongTensor (n, k), hardest first.
    """
    n = similarity.size(0)
    if not 1 <= k <= n - 1:
        raise ValueError(f"k must be between 1 and the number of in-batch negatives ({n - 1}), got {k}")
    masked = similarity.detach().masked_fill(~offdiagonal_mask(n, similarity.device), float("-inf"))
    return masked.topk(k, dim=1).indices


def candidate_cosines(anchors: Tensor, candidates: Tensor, row_candidates: Tensor | None = None) -> Tensor:
    """Cosines of each anchor with the shared candidates and with its own row candidates.

    Args:
        anchors: (N, d).
        candidates: (C, d), seen by every anchor; anchor ``i``'s positive must be row ``i``.
        row_candidates: optional (N, S, d); ``row_candidates[i]`` are extra candidates of anchor ``i`` only
            (synthetic negatives).

    Returns:
        (N, C + S) cosine matrix: shared columns first, then the S row columns.
    """
    a = normalize(anchors)
    cos = a @ normalize(candidates).T
    if row_candidates is not None and row_candidates.size(1) > 0:
        if row_candidates.size(0) != a.size(0):
            raise ValueError(
                f"row_candidates has {row_candidates.size(0)} rows but there are {a.size(0)} anchors"
            )
        row_cos = torch.einsum("nd,nsd->ns", a, normalize(row_candidates))
        cos = torch.cat([cos, row_cos], dim=1)
    return cos


def contrastive_logits(
    cos: Tensor,
    temperature: float,
    focal_m: float | None = None,
    positive_columns: Tensor | None = None,
) -> Tensor:
    """Turn a cosine matrix into InfoNCE logits, optionally with the Focal-InfoNCE modulation.

    Plain: ``cos / τ``. Focal (Hou & Li 2023, Eq. 2): the positive ``s_p`` becomes ``s_p² / τ`` and every
    negative ``s_n`` becomes ``s_n (s_n + m) / τ``: hard negatives (large ``s_n``) are weighted up, easy
    ones down, and a positive that is not yet close is pushed harder.

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


def info_nce(logits: Tensor, positive_columns: Tensor | None = None) -> Tensor:
    """Mean cross-entropy of each row's logits with its positive column (default: the diagonal)."""
    if positive_columns is None:
        positive_columns = torch.arange(logits.size(0), device=logits.device)
    return F.cross_entropy(logits, positive_columns)


@torch.no_grad()
def contrastive_stats(cos: Tensor, num_in_batch: int, num_synthetic: int = 0) -> dict[str, Tensor]:
    """Mean positive, in-batch negative and synthetic-negative cosine of a batch (MixCSE Fig. 4a).

    Args:
        cos: (N, K) cosines laid out as ``[in-batch candidates (num_in_batch) | other shared negatives |
            synthetic negatives (num_synthetic)]`` with the positive of row ``i`` at column ``i``.
        num_in_batch: number of in-batch candidate columns (N for pairs).
        num_synthetic: number of trailing synthetic columns.

    Returns:
        Detached scalar tensors ``positive``, ``negative`` and, if there are synthetic columns, ``synthetic``
        (kept as tensors so that reading them is the only device synchronisation).
    """
    n = cos.size(0)
    rows = torch.arange(n, device=cos.device)
    stats = {"positive": cos[rows, rows].mean()}
    in_batch = cos[:, :num_in_batch]
    mask = torch.ones_like(in_batch, dtype=torch.bool)
    mask[rows, rows] = False
    stats["negative"] = in_batch[mask].mean() if mask.any() else cos.new_zeros(())
    if num_synthetic:
        stats["synthetic"] = cos[:, cos.size(1) - num_synthetic :].mean()
    return {k: v.detach() for k, v in stats.items()}


# ---------------------------------------------------------------------------------------------------------------
# HNCSE (Liu et al. 2024): positive mixing and hard-negative mixing
# ---------------------------------------------------------------------------------------------------------------

#: names of the positive-mixing cases, indexed by the ``cases`` codes that :func:`positive_mixing` returns
PM_CASES = ("far", "near", "inverted", "unsafe")
PM_FAR, PM_NEAR, PM_INVERTED, PM_UNSAFE = range(4)


class PositiveMix(NamedTuple):
    """Result of :func:`positive_mixing` for a batch of N anchors."""

    #: (N, d) the new, normalised positives ``p_i`` (``ĥ'_i`` itself in the rows that are not mixed)
    positives: Tensor
    #: (N,) ``j*``: the hardest in-batch negative of each anchor
    partners: Tensor
    #: (N,) weight of ``ĥ'_i`` in the mix (1 where the row is not mixed); constants, no gradient
    weights: Tensor
    #: (N,) long, the case of each row, an index into :data:`PM_CASES`
    cases: Tensor
    #: (N,) bool, rows whose positive was replaced by a mixture
    mixed: Tensor


def positive_mixing_weights(
    d1: Tensor, d2: Tensor, threshold: float, w1: float, w2: float, single: bool = False
) -> tuple[Tensor, Tensor, Tensor]:
    """The case and mixing weight of HNCSE's positive mixing (paper §3.1, Eq. 2) for each anchor.

    With ``d1 = cos(h_i, h'_i)``, ``d2 = cos(h_i, h'_j*)`` (``j*`` the hardest in-batch negative) and
    ``r = (d1 - d2) / d1``:

    - ``"unsafe"``: ``d1 <= 0`` or ``d1 + d2 <= 0``: keep ``h'_i`` (``r`` flips sign and the convex weights below
      stop being convex, so the printed equation would invert or blow up the positive);
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

    Returns:
        ``(weights, cases, mixed)``: (N,) float weight of ``h'_i`` (1 where not mixed), (N,) long case code (index
        into :data:`PM_CASES`), (N,) bool mask of the mixed rows. All without gradient.
    """
    d1, d2 = d1.detach().float(), d2.detach().float()
    safe = (d1 > 0) & (d1 + d2 > 0)
    inverted = safe & (d1 <= d2)
    ahead = safe & (d1 > d2)
    # r is only evaluated where d1 > 0; elsewhere the divisor is replaced to keep the tensor finite.
    r = (d1 - d2) / torch.where(safe, d1, torch.ones_like(d1))
    near = ahead & (r <= threshold)
    cases = torch.full_like(d1, PM_UNSAFE, dtype=torch.long)
    cases[ahead] = PM_FAR
    cases[near] = PM_NEAR
    cases[inverted] = PM_INVERTED
    mix_inverted = torch.zeros_like(inverted) if single else inverted
    convex = d1 / torch.where(mix_inverted, d1 + d2, torch.ones_like(d1))
    weights = torch.ones_like(d1)
    weights = torch.where(near, torch.full_like(d1, w1 / (w1 + w2)), weights)
    weights = torch.where(mix_inverted, convex, weights)
    return weights, cases, near | mix_inverted


def positive_mixing(
    anchors: Tensor,
    positives: Tensor,
    threshold: float,
    w1: float,
    w2: float,
    single: bool = False,
    detach_mix: bool = False,
) -> PositiveMix:
    """HNCSE's positive mixing (paper §3.1, Eq. 2): mix each positive with the anchor's hardest in-batch negative.

    ``j* = argmax_{j != i} cos(h_i, h'_j)``; the mixed rows get ``p_i = normalize(w·ĥ'_i + (1-w)·ĥ'_j*)`` with the
    weight ``w`` of :func:`positive_mixing_weights`; the other rows keep ``ĥ'_i``. The case selection, ``j*`` and the
    weights are constants (no gradient through them).

    Args:
        anchors: (N, d) ``h``.
        positives: (N, d) ``h'``; row ``j`` is also the in-batch negative ``j`` of the other anchors.
        threshold, w1, w2, single: see :func:`positive_mixing_weights`.
        detach_mix: no gradient through the mixed rows (the rows that are not mixed keep their gradient).

    Returns:
        A :class:`PositiveMix`.
    """
    n = anchors.size(0)
    positives = normalize(positives)
    with torch.no_grad():
        similarity = normalize(anchors) @ positives.T
        partners = hardest_negatives(similarity, k=1).squeeze(1)
        rows = torch.arange(n, device=similarity.device)
        d1, d2 = similarity[rows, rows], similarity[rows, partners]
    weights, cases, mixed = positive_mixing_weights(d1, d2, threshold, w1, w2, single)
    mixture = mix(positives, positives[partners], weights.unsqueeze(1))
    if detach_mix:
        mixture = mixture.detach()
    return PositiveMix(torch.where(mixed.unsqueeze(1), mixture, positives), partners, weights, cases, mixed)


def sample_distinct_pairs(
    rows: int, k: int, num: int, generator: torch.Generator | None = None, device=None
) -> tuple[Tensor, Tensor]:
    """``num`` ordered pairs ``(a, b)`` of distinct indices in ``[0, k)`` for each of ``rows`` rows.

    Uniform over the ``k (k-1)`` ordered pairs, drawn independently (with replacement across pairs), vectorised:
    ``a`` is uniform and ``b = (a + o) mod k`` with ``o`` uniform in ``[1, k)``.

    Returns:
        Two LongTensors of shape (rows, num).
    """
    if k < 2:
        raise ValueError(f"pairs of distinct indices need k >= 2, got {k}")
    source = generator.device if generator is not None else device
    first = torch.randint(k, (rows, num), generator=generator, device=source)
    second = (first + torch.randint(1, k, (rows, num), generator=generator, device=source)) % k
    if device is not None:
        first, second = first.to(device), second.to(device)
    return first, second


def adaptive_alpha(cosine: Tensor) -> Tensor:
    """An adaptive mixing weight for HNCSE's hard-negative mixing (paper Eq. 8): ``α = (3 - c) / 4``.

    ``c = cos(G_a, G_b)`` ∈ [-1, 1] is mapped linearly to ``α`` ∈ [0.5, 1]. Two near-duplicate negatives
    (``c → 1``) are mixed evenly; as they diverge the mix leans towards ``G_a``. The reason: the normalised mix of
    two unit vectors is ``(α G_a + (1-α) G_b) / ρ`` with ``ρ² = α² + (1-α)² + 2α(1-α)c``, so its cosine with the
    anchor is the weighted cosine divided by ``ρ``. An even mix of dissimilar negatives has a small ``ρ``
    (0.71 at ``c = 0``, 0 at ``c = -1``): it is artificially harder than both parents (up to a false positive) or,
    for opposite parents, an arbitrary direction. ``α = (3 - c) / 4`` keeps ``ρ >= 0.79`` for ``c >= 0`` and
    ``ρ = 1`` at ``c = -1``, so the synthetic negative stays "neither too similar nor too dissimilar" (§3.2).
    """
    return (3.0 - cosine.clamp(-1.0, 1.0)) / 4.0


#: adaptive α functions accepted by name
ALPHA_FUNCTIONS: dict[str, Callable[[Tensor], Tensor]] = {"adaptive": adaptive_alpha}


def hard_negative_pairs(hard: Tensor, num_mixed: int, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
    """The two parents of each of ``num_mixed`` mixtures per row: ``num_mixed`` pairs of distinct positions drawn
    by :func:`sample_distinct_pairs` among the ``k`` columns of ``hard``, returned as indices into the pool.

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


def mix_hard_negatives(
    pool: Tensor,
    hard: Tensor,
    num_mixed: int,
    alpha: float | Callable[[Tensor], Tensor | float] = 0.5,
    generator: torch.Generator | None = None,
) -> Tensor:
    """HNCSE's hard-negative mixing (paper §3.2, Eq. 7-8): ``num_mixed`` mixtures of pairs of hard negatives per row.

    For row ``i`` and each of ``num_mixed`` pairs ``(a, b)`` of distinct positions drawn by
    :func:`sample_distinct_pairs`: ``u = normalize(α·Ĝ_a + (1-α)·Ĝ_b)`` with ``G = pool[hard[i]]``.

    Args:
        pool: (C, d) the vectors the indices point into.
        hard: (N, k) LongTensor, the hard negatives of each row (indices into ``pool``), ``k >= 2``.
        num_mixed: ``m``, the number of mixtures per row.
        alpha: the weight of ``G_a``: a float in [0, 1], or a function of the (N, m) tensor ``cos(G_a, G_b)``
            returning weights (a tensor broadcastable to (N, m), or a float), evaluated without gradient.
        generator: random source of the pairs (``None``: torch's global generator).

    Returns:
        (N, num_mixed, d) normalised mixtures. Gradients flow into ``pool`` (detach the result to stop them).
    """
    parents_a, parents_b = hard_negative_pairs(hard, num_mixed, generator=generator)
    g_a = normalize(pool[parents_a])
    g_b = normalize(pool[parents_b])
    if callable(alpha):
        with torch.no_grad():
            weight = torch.as_tensor(alpha((g_a * g_b).sum(-1)), dtype=g_a.dtype, device=g_a.device)
        if weight.dim() > 0:
            weight = weight.unsqueeze(-1)
    else:
        weight = float(alpha)
    return mix(g_a, g_b, weight)


def hard_negative_mixing(
    anchors: Tensor,
    pool: Tensor,
    k: int,
    num_mixed: int,
    alpha: float | Callable[[Tensor], Tensor | float] = 0.5,
    generator: torch.Generator | None = None,
    single: bool = False,
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
        (N, k, d) if ``single`` else (N, num_mixed, d), normalised, to be used as ``row_candidates`` of
        :func:`candidate_cosines`.
    """
    with torch.no_grad():
        hard = hardest_negatives(normalize(anchors) @ normalize(pool).T, k)
    if single:
        return normalize(pool)[hard]
    return mix_hard_negatives(pool, hard, num_mixed, alpha=alpha, generator=generator)


def mixed_negative_cosines(
    anchors: Tensor,
    pool: Tensor,
    parents_a: Tensor,
    parents_b: Tensor,
    alpha: float | Callable[[Tensor], Tensor | float] = 0.5,
    detach_pool: bool = False,
) -> Tensor:
    """``cos(h_i, u_ij)`` for the mixtures ``u_ij = normalize(α·Ĝ_a + (1-α)·Ĝ_b)`` of :func:`mix_hard_negatives`,
    computed from the (N, C) anchor-pool cosines and the (C, C) Gram matrix of the pool instead of the (N, m, d)
    mixtures: ``u·ĥ = (α ĥ·Ĝ_a + (1-α) ĥ·Ĝ_b) / ||α Ĝ_a + (1-α) Ĝ_b||`` with
    ``||·||² = α² Ĝ_a·Ĝ_a + (1-α)² Ĝ_b·Ĝ_b + 2α(1-α) Ĝ_a·Ĝ_b``.

    Mathematically identical to ``einsum("nd,nmd->nm", normalize(anchors), mix_hard_negatives(...))`` with the
    same parents (zero vectors included: their mixture has cosine 0), gradients included, at a fraction of the cost
    (no (N, m, d) tensor and its normalisations in the forward and backward pass).

    Args:
        anchors: (N, d).
        pool: (C, d) the vectors the parent indices point into.
        parents_a, parents_b: (N, m) LongTensors from :func:`hard_negative_pairs`.
        alpha: as in :func:`mix_hard_negatives` (a callable receives the (N, m) ``cos(G_a, G_b)``, without gradient).
        detach_pool: no gradient through the mixtures into ``pool`` (HNCSE's ``hnm_gradient=False``).

    Returns:
        (N, m) cosines.
    """
    a = normalize(anchors)
    unit = normalize(pool)
    if detach_pool:
        unit = unit.detach()
    gram = unit @ unit.T
    sim = a @ unit.T
    g_ab = gram[parents_a, parents_b]
    diagonal = gram.diagonal()
    if callable(alpha):
        with torch.no_grad():
            weight = torch.as_tensor(alpha(g_ab.detach()), dtype=g_ab.dtype, device=g_ab.device)
    else:
        weight = float(alpha)
    numerator = weight * sim.gather(1, parents_a) + (1.0 - weight) * sim.gather(1, parents_b)
    squared_norm = (weight * weight * diagonal[parents_a] + (1.0 - weight) ** 2 * diagonal[parents_b]
                    + 2.0 * weight * (1.0 - weight) * g_ab)
    # F.normalize divides by max(||x||, eps); clamping the square first keeps sqrt's gradient finite at 0
    return numerator / squared_norm.clamp_min(_EPS * _EPS).sqrt()


def hard_negative_mixing_cosines(
    anchors: Tensor,
    pool: Tensor,
    k: int,
    num_mixed: int,
    alpha: float | Callable[[Tensor], Tensor | float] = 0.5,
    generator: torch.Generator | None = None,
    detach_pool: bool = False,
) -> Tensor:
    """The (N, num_mixed) cosines of each anchor with its synthetic hard negatives from
    :func:`hard_negative_mixing` (same random draws for the same generator state), without building the
    mixtures; see :func:`mixed_negative_cosines`. Used by :class:`~st_hardneg.HNCSELoss` in training.
    """
    with torch.no_grad():
        hard = hardest_negatives(normalize(anchors) @ normalize(pool).T, k)
    parents_a, parents_b = hard_negative_pairs(hard, num_mixed, generator=generator)
    return mixed_negative_cosines(anchors, pool, parents_a, parents_b, alpha=alpha, detach_pool=detach_pool)
