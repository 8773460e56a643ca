"""The retrieval recipe shared by ``st-hardneg train --task retrieval``, ``benchmarks/retrieval.py`` and
``notebooks/retrieval.ipynb``: mine one hard negative per (query, positive) pair, train with false-negative control,
score retrieval.

- :data:`MINING`: the mining settings (``mine_hard_negatives``, TopK-PercPos 95 %).
- :data:`TRAINING`: the fine-tuning protocol (the model's own mean pooling, 128 tokens, 1 epoch at batch 64,
  lr 2e-5 with 10 % warm-up).
- :func:`mined_triplets`: the (anchor, positive, negative) training set of an :class:`MRPCRetrieval` split, mined once
  and cached as JSON (keyed by the model, the settings and the data files' bytes).
- :func:`train_config`: a :class:`~st_hardneg.training.TrainConfig` with :data:`TRAINING`'s values.

>>> from st_hardneg.retrieval_recipe import MINING, TRAINING, mined_triplets
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from st_hardneg.retrieval_data import MRPCRetrieval
    from st_hardneg.training import TrainConfig

#: mine_hard_negatives settings: top-5 candidates below 95 % of the anchor-positive score (NV-Retriever's
#: TopK-PercPos), then the first that is not the anchor, the positive or a labelled paraphrase of the anchor
MINING: dict[str, Any] = {"num_candidates": 5, "relative_margin": 0.05, "range_min": 0, "range_max": None}
#: the fine-tuning protocol of the retrieval benchmark and ``st-hardneg train --task retrieval``
TRAINING: dict[str, Any] = {"pooling": "mean", "max_seq_length": 128, "batch_size": 64, "learning_rate": 2e-5,
                            "epochs": 1, "warmup_ratio": 0.1}
#: where mined training sets are cached
DEFAULT_CACHE_DIR = Path.home() / ".cache" / "st_hardneg" / "retrieval"


def mined_triplets(
    data: MRPCRetrieval,
    load_model: Callable[[], Any],
    *,
    model_key: str,
    data_key: str,
    mining: dict[str, Any] | None = None,
    cache_dir: str | Path = DEFAULT_CACHE_DIR,
    prefix: str = "mrpc-mined",
    limit: int = 0,
    min_rows: int = 1,
    batch_size: int = 128,
) -> tuple[Any, dict[str, Any]]:
    """One mined hard negative per training pair of ``data`` (see
    :func:`st_hardneg.mining.mine_training_negatives`), mined once and cached.

    Args:
        data: a split from :func:`~st_hardneg.retrieval_data.build_mrpc_retrieval` or
            :func:`~st_hardneg.retrieval_data.dev_split`: its ``train_pairs`` are mined against its ``train_corpus``,
            never against its task's sentences.
        load_model: returns the model that ranks the candidates (called only when the set is not cached yet).
        model_key: names that model in the cache key (e.g. its path, or ``"default"``).
        data_key: identifies the data in the cache key (e.g. :func:`st_hardneg.mining.file_digest` of the files and
            the split's settings).
        mining: :data:`MINING`'s keys to override.
        cache_dir: the cache folder.
        prefix: the cache file's name prefix.
        limit: mine only the first ``limit`` pairs (0 = all; smoke runs).
        min_rows: fewer mined triplets than this (e.g. one batch) raise ``ValueError``.
        batch_size: encoding batch size of the mining.

    Returns:
        ``(dataset, info)``: a ``datasets.Dataset`` with columns ``anchor``, ``positive``, ``negative``, and what a
        results file should record (cache file, pair and triplet counts, mining seconds, settings).

    Raises:
        ValueError: an unknown mining setting, a test-task sentence in the mined set, or fewer than ``min_rows``
            triplets.
    """
    from st_hardneg.mining import cached_dataset, mine_training_negatives
    from st_hardneg.retrieval_data import assert_no_test_leak

    unknown = sorted(set(mining or {}) - set(MINING))
    if unknown:
        raise ValueError(f"unknown mining setting(s) {unknown}; choose from {', '.join(MINING)}")
    settings = {**MINING, **(mining or {})}
    pairs = data.train_pairs[:limit] if limit else data.train_pairs
    key = {"model": model_key, "pooling": TRAINING["pooling"], "max_seq_length": TRAINING["max_seq_length"],
           "mining": settings, "data": data_key, "limit": limit}
    dataset, path, seconds = cached_dataset(
        cache_dir, prefix, key,
        lambda: mine_training_negatives(load_model(), pairs, data.train_corpus, known_positives=data.known_paraphrases,
                                        forbidden=data.protected_sentences(), batch_size=batch_size, **settings))
    assert_no_test_leak(data, [s for column in dataset.column_names for s in dataset[column]])
    if len(dataset) < min_rows:
        raise ValueError(f"mining kept {len(dataset)} triplets from {len(pairs)} pairs, fewer than one batch "
                         f"({min_rows}); loosen the mining filters (relative_margin) or use more pairs. Cached in {path}.")
    info = {"cache_file": str(path), "pairs": len(pairs), "triplets": len(dataset), "mining_seconds": seconds,
            "mining": settings}
    return dataset, info


def train_config(output_dir: str | Path, seed: int = 0, **overrides: Any) -> TrainConfig:
    """The :class:`~st_hardneg.training.TrainConfig` of the retrieval recipe (:data:`TRAINING`, final model kept, no
    checkpoints); ``overrides`` replace any of its fields."""
    from st_hardneg.training import TrainConfig

    values: dict[str, Any] = {"output_dir": str(output_dir), "batch_size": TRAINING["batch_size"],
                              "learning_rate": TRAINING["learning_rate"], "epochs": TRAINING["epochs"],
                              "warmup_ratio": TRAINING["warmup_ratio"], "seed": seed, "eval_steps": 0,
                              "save_checkpoints": False}
    values.update(overrides)
    return TrainConfig(**values)
