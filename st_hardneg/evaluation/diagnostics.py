"""Embedding diagnostics: alignment and uniformity (Wang & Isola, 2020) on STS-B, and the training-time cosines.

- :func:`alignment_uniformity` is the analysis of SimCSE Fig. 2 / MixCSE Fig. 5 / Focal-InfoNCE Table 3 /
  AdCSE Fig. 3.
- :class:`LossDiagnosticsCallback` adds the mean positive / negative / synthetic-negative cosines of the loss's
  last training batch (MixCSE Fig. 4a) to the Trainer's logs at every logging step.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from transformers import TrainerCallback

from st_hardneg.data import read_sts_pairs, resolve_senteval_dir
from st_hardneg.evaluation.encoding import check_embeddings, encode_unique
from st_hardneg.reporting import markdown_table

logger = logging.getLogger(__name__)

_STSB_TASK = {"dev": "STSBenchmark-dev", "test": "STSBenchmark"}


def _normalize(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def alignment(x: np.ndarray, y: np.ndarray, alpha: float = 2.0) -> float:
    """Wang & Isola's alignment ``E ||f(x) − f(y)||^alpha`` over positive pairs (rows of ``x`` and ``y``), on
    L2-normalised embeddings (the inputs are normalised here). Lower is better.

    Raises:
        DegenerateEmbeddingsError: NaN, infinite or zero embeddings, or all identical (a collapsed encoder would
            otherwise get a "perfect" alignment of 0).
    """
    if len(x) != len(y) or len(x) == 0:
        raise ValueError(f"alignment needs two non-empty arrays of the same length, got {len(x)} and {len(y)}")
    check_embeddings(np.concatenate([np.asarray(x), np.asarray(y)]), "the positive pairs")
    x, y = _normalize(x), _normalize(y)
    return float(np.mean(np.linalg.norm(x - y, axis=1) ** alpha))


def uniformity(x: np.ndarray, t: float = 2.0) -> float:
    """Wang & Isola's uniformity ``log E_{i<j} exp(−t ||f(x_i) − f(x_j)||²)`` over all distinct pairs of rows, on
    L2-normalised embeddings (the inputs are normalised here). Lower is better.

    Raises:
        DegenerateEmbeddingsError: NaN, infinite or zero embeddings, or all identical.
    """
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
    model,
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
        data_dir: the SentEval directory (see :func:`st_hardneg.data.resolve_senteval_dir`).
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


class LossDiagnosticsCallback(TrainerCallback):
    """Log the loss's ``diagnostics`` (mean cosines of the last training batch) with the Trainer's own logs.

    At every logging step, the entries ``cos_positive``, ``cos_negative`` and (for losses with synthetic
    negatives) ``cos_synthetic`` are added next to ``loss`` and ``learning_rate``: in ``trainer.state.log_history``
    (so they are saved in ``trainer_state.json`` and can be plotted with
    :func:`st_hardneg.plots.plot_training_curves`) and in the ``logs`` passed on to the callbacks after this one
    (the progress printer, TensorBoard, W&B …; :meth:`attach` puts this callback first so that all of them see
    the entries). Only read-only: the loss value and the gradients are untouched. Evaluation logs are left alone.

    The Trainer appends a copy of ``logs`` to ``state.log_history`` just before calling ``on_log``, so this
    callback updates both that entry and the ``logs`` dict.

    Args:
        loss: the training loss (any st-hardneg loss, i.e. with a ``diagnostics`` property), or a dict
            ``{dataset name: loss}`` for multi-dataset training (keys are then prefixed with the dataset name).
        prefix: prefix of the logged cosine keys (``cos_positive`` …); the false-negative counts keep their own names
            (``masked_false_negatives``, ``masked_false_negatives_total``), which are not cosines.

    Example:
        ::

            from st_hardneg import MixCSELoss
            from st_hardneg.evaluation import LossDiagnosticsCallback

            loss = MixCSELoss(model, lam=0.2)
            trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=train, loss=loss)
            LossDiagnosticsCallback(loss).attach(trainer)
            trainer.train()
            print(trainer.state.log_history[0])  # {'loss': ..., 'cos_positive': ..., 'cos_negative': ..., ...}
    """

    def __init__(self, loss, prefix: str = "cos_") -> None:
        losses = loss if isinstance(loss, Mapping) else {"": loss}
        for name, item in losses.items():
            if not hasattr(item, "diagnostics"):
                raise TypeError(
                    f"{type(item).__name__}{f' ({name})' if name else ''} has no `diagnostics` property; "
                    "LossDiagnosticsCallback needs an st-hardneg loss (st_hardneg.losses.HardNegativeLoss)."
                )
        self.losses = dict(losses)
        self.prefix = prefix

    def attach(self, trainer) -> LossDiagnosticsCallback:
        """Add this callback to ``trainer`` ahead of every other callback (so reporting integrations see the
        entries); returns ``self``."""
        trainer.callback_handler.callbacks.insert(0, self)
        return self

    def current(self) -> dict[str, float]:
        """The entries that would be logged now: ``{prefix + key: value}`` for the cosines, ``{key: value}`` for the
        masked false-negative counts (``{name}_...`` for dicts)."""
        entries: dict[str, float] = {}
        for name, loss in self.losses.items():
            for key, value in loss.diagnostics.items():
                logged = key if key.startswith("masked_") else f"{self.prefix}{key}"
                entries[f"{name}_{logged}" if name else logged] = round(float(value), 6)
        return entries

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is None or "loss" not in logs:  # evaluation / end-of-training summaries
            return control
        entries = self.current()
        if not entries:
            return control
        logs.update(entries)
        if state.log_history and state.log_history[-1].get("step") == state.global_step \
                and "loss" in state.log_history[-1]:
            state.log_history[-1].update(entries)
        return control
