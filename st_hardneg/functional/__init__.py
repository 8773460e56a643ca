"""Shared math of the st-hardneg losses, written once and reused by every loss.

Every function here works on plain tensors and knows nothing about models, so each piece can be tested against a hand
computation:

- :mod:`st_hardneg.functional.core`: float32, overflow-safe normalisation (:func:`normalize`, :func:`row_norms`),
  :func:`mix`, mixing partners (:func:`partner_indices`), top-k negatives (:func:`hardest_negatives`),
  :func:`candidate_cosines`, :func:`contrastive_logits` (plain or Focal-InfoNCE), :func:`info_nce_rows`, the
  diagnostics :func:`contrastive_stats`, and the false-negative helpers :func:`mask_columns` (drop masked candidates
  from the denominator), :func:`top_candidates` (top-k among the allowed candidates) and :func:`allowed_partners`;
- :mod:`st_hardneg.functional.hncse`: HNCSE's positive mixing (:func:`positive_mixing`) and hard-negative mixing
  (:func:`hard_negative_mixing`, :func:`mixed_negative_cosines`).
"""

from st_hardneg.functional.core import (
    NORM_EPS,
    PartnerMode,
    allowed_partners,
    autocast_disabled,
    candidate_cosines,
    contrastive_logits,
    contrastive_stats,
    float32_math,
    hardest_negatives,
    info_nce,
    info_nce_rows,
    loss_precision,
    mask_columns,
    mix,
    normalize,
    offdiagonal_mask,
    partner_indices,
    random_derangement,
    row_norms,
    top_candidates,
)
from st_hardneg.functional.hncse import (
    ALPHA_FUNCTIONS,
    PM_CASES,
    PM_FAR,
    PM_INVERTED,
    PM_NEAR,
    PM_UNSAFE,
    Alpha,
    PositiveMix,
    adaptive_alpha,
    alpha_weights,
    compact_index_dtype,
    hard_negative_mixing,
    hard_negative_mixing_cosines,
    hard_negative_pairs,
    mix_hard_negatives,
    mixed_negative_cosines,
    positive_mixing,
    positive_mixing_weights,
    sample_distinct_pairs,
)

__all__ = [
    "ALPHA_FUNCTIONS", "NORM_EPS", "PM_CASES", "PM_FAR", "PM_INVERTED", "PM_NEAR", "PM_UNSAFE", "Alpha",
    "PartnerMode", "PositiveMix", "adaptive_alpha", "alpha_weights", "autocast_disabled", "float32_math",
    "loss_precision", "candidate_cosines", "compact_index_dtype", "contrastive_logits", "contrastive_stats",
    "hard_negative_mixing", "hard_negative_mixing_cosines", "hard_negative_pairs", "hardest_negatives", "info_nce",
    "info_nce_rows", "mix", "mix_hard_negatives", "mixed_negative_cosines", "normalize", "offdiagonal_mask",
    "partner_indices", "positive_mixing", "positive_mixing_weights", "random_derangement", "row_norms",
    "sample_distinct_pairs", "allowed_partners", "mask_columns", "top_candidates",
]
