"""Embedding diagnostics: alignment and uniformity (Wang & Isola, 2020) on STS-B.

- :func:`alignment_uniformity` is the analysis of SimCSE Fig. 2 / MixCSE Fig. 5 / Focal-InfoNCE Table 3 /
  AdCSE Fig. 3.
- The training-time cosines of the loss's last batch are logged by
  :class:`st_hardneg.training.callbacks.LossDiagnosticsCallback`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from st_hardneg.data.senteval import read_sts_pairs, resolve_senteval_dir
from st_hardneg.evaluation.encoding import check_embeddings, encode_unique
from st_hardneg.reporting import markdown_table

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

logger = logging.getLogger(__name__)

_STSB_TASK = {"dev": "STSBenchmark-dev", "test": "STSBenchmark"}


def _normalize(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def _matrix(x: np.ndarray, name: str) -> np.ndarray:
    """``x`` as a 2-D array (one embedding a row), or a ValueError naming the argument."""
    array = np.asarray(x)
    if array.ndim != 2:
        raise ValueError(f"{name} must be a 2-D array (one embedding a row), got shape {array.shape}")
    return array


def alignment(x: np.ndarray, y: np.ndarray, alpha: float = 2.0) -> float:
    """Wang & Isola's alignment ``E ||f(x) − f(y)||^alpha`` over positive pairs (rows of ``x`` and ``y``), on
    L2-normalised embeddings (the inputs are normalised here). Lower is better.

    Raises:
        DegenerateEmbeddingsError: NaN, infinite or zero embeddings, or collapsed ones (all within a relative spread
            of :data:`~st_hardneg.evaluation.encoding.COLLAPSE_TOLERANCE` of one point: a collapsed encoder would
            otherwise get a "perfect" alignment near 0).
        ValueError: ``x`` or ``y`` not 2-D, of different lengths or widths, empty, or ``alpha`` not > 0.
    """
    from st_hardneg.validation import check_number

    x, y = _matrix(x, "x"), _matrix(y, "y")
    if check_number(alpha, "alpha", minimum=0.0) == 0.0:
        raise ValueError(f"alpha must be a finite number > 0, got {alpha!r}")
    if len(x) != len(y) or len(x) == 0:
        raise ValueError(f"alignment needs two non-empty arrays of the same length, got {len(x)} and {len(y)}")
    if x.shape[1] != y.shape[1]:
        raise ValueError(f"x and y must have the same width, got {x.shape[1]} and {y.shape[1]}")
    check_embeddings(np.concatenate([x, y]), "the positive pairs")
    x, y = _normalize(x), _normalize(y)
    return float(np.mean(np.linalg.norm(x - y, axis=1) ** alpha))


def uniformity(x: np.ndarray, t: float = 2.0) -> float:
    """Wang & Isola's uniformity ``log E_{i<j} exp(−t ||f(x_i) − f(x_j)||²)`` over all distinct pairs of rows, on
    L2-normalised embeddings (the inputs are normalised here). Lower is better.

    Raises:
        DegenerateEmbeddingsError: NaN, infinite or zero embeddings, or collapsed ones (see :func:`alignment`).
        ValueError: ``x`` not 2-D or with fewer than 2 rows, or ``t`` not > 0.
    """
    from st_hardneg.validation import check_number

    x = _matrix(x, "x")
    if check_number(t, "t", minimum=0.0) == 0.0:
        raise ValueError(f"t must be a finite number > 0, got {t!r}")
    n = len(x)
    if n < 2:
        raise ValueError(f"uniformity needs at least 2 embeddings, got {n}")
    check_embeddings(x, "the uniformity sample")
    x = _normalize(x)
    # ||a − b||² = 2 − 2 a·b for unit vectors; rows are processed in blocks to bound memory. Every term lies in
    # [exp(−4t), 1] (t = 2: [3e-4, 1]), so a plain float64 sum is accurate.
    total, count, block = 0.0, n * (n - 1) // 2, 2048
    for start in range(0, n, block):
        sim = x[start : start + block] @ x.T
        rows = np.arange(start, min(start + block, n))
        upper = np.arange(n)[None, :] > rows[:, None]  # each unordered pair once
        total += float(np.exp(-t * np.clip(2.0 - 2.0 * sim[upper], 0.0, None)).sum())
    return float(np.log(total / count))


def alignment_uniformity(
    model: SentenceTransformer,
    data_dir: str | Path | None = None,
    split: str = "dev",
    threshold: float = 4.0,
    t: float = 2.0,
    batch_size: int = 64,
    show_progress_bar: bool = False,
) -> dict[str, Any]:
    """Alignment and uniformity of a model's sentence embeddings on STS-B, as SimCSE computes them.

    - Positive pairs: the STS-B pairs with gold score ``>= threshold`` (4.0); alignment is their mean squared
      distance (``alpha = 2``).
    - Data distribution: every distinct sentence of the split (both columns, duplicates removed, since a
      repeated sentence would add zero-distance pairs); uniformity is ``log`` of the mean of ``exp(−t·d²)`` over
      all pairs of distinct sentences, ``t = 2``.
    - Embeddings are L2-normalised (Wang & Isola define both metrics on the unit sphere) and computed in float64.
      Each distinct sentence is encoded once at the model's full length.
    - Split: the STS-B development set (``sts-dev.csv``, 1,500 pairs) by default, the set of SimCSE's Fig. 2;
      ``split="test"`` uses ``sts-test.csv``.

    Args:
        model: a SentenceTransformer.
        data_dir: the SentEval directory (see :func:`st_hardneg.data.senteval.resolve_senteval_dir`).
        split: ``"dev"`` or ``"test"``.
        threshold: minimum gold score (inclusive, 0–5 scale) of a positive pair.
        t: uniformity temperature.
        batch_size: encoding batch size.
        show_progress_bar: show the encoding progress bar.

    Returns:
        ``{"alignment", "uniformity", "n_pairs" (positive pairs), "n_sentences", "split", "threshold", "t"}``.
        Both metrics are "lower is better".

    Example:
        ::

            from st_hardneg.evaluation import alignment_uniformity

            au = alignment_uniformity(model, "path/to/senteval")
            print(f"align {au['alignment']:.3f}  uniform {au['uniformity']:.3f}")
    """
    if split not in _STSB_TASK:
        raise ValueError(f"split must be 'dev' or 'test', got {split!r}")
    root = resolve_senteval_dir(data_dir)
    s1, s2, gold = read_sts_pairs(root, _STSB_TASK[split])
    positives = [(a, b) for a, b, g in zip(s1, s2, gold, strict=True) if g >= threshold]
    if not positives:
        raise ValueError(f"no STS-B {split} pair has a gold score >= {threshold}")
    table = encode_unique(model, [*s1, *s2], batch_size=batch_size, show_progress_bar=show_progress_bar)
    align = alignment(np.stack([table[a] for a, _ in positives]), np.stack([table[b] for _, b in positives]))
    uniform = uniformity(np.stack(list(table.values())), t=t)
    return {"alignment": align, "uniformity": uniform, "n_pairs": len(positives), "n_sentences": len(table),
            "split": split, "threshold": threshold, "t": t}


def format_alignment_table(rows: Mapping[str, Mapping[str, Any]]) -> str:
    """A markdown table, one row per model: ``{name: alignment_uniformity(...) result}``."""
    if not rows:
        return ""
    header = ["model", "alignment", "uniformity", "STS-B split", "positive pairs", "sentences"]
    body = [[name, f"{r['alignment']:.4f}", f"{r['uniformity']:.4f}", r.get("split", "–"), r.get("n_pairs", "–"),
             r.get("n_sentences", "–")] for name, r in rows.items()]
    return markdown_table(header, body).rstrip("\n")
