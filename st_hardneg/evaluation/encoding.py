"""Encoding helpers shared by every evaluation: whole-sentence encoding and one encode per distinct sentence."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import numpy as np


def model_length_limit(model) -> int | None:
    """The longest input the encoder accepts: its ``max_position_embeddings`` (RoBERTa-style models reserve two
    positions for the padding offset). sentence-transformers stores ``max_seq_length`` in the tokenizer's
    ``model_max_length``, so the tokenizer cannot tell the model's real limit once a training length is set."""
    try:
        config = model[0].auto_model.config
    except (AttributeError, IndexError, TypeError, KeyError):
        return None
    if hasattr(config, "get_text_config"):
        config = config.get_text_config()
    limit = getattr(config, "max_position_embeddings", None)
    if not isinstance(limit, int) or limit <= 0:
        return None
    offset = 2 if getattr(config, "model_type", "") in ("roberta", "xlm-roberta", "camembert") else 0
    return limit - offset


@contextmanager
def full_length(model) -> Iterator[None]:
    """Encode whole sentences, as SentEval does: lift a training ``max_seq_length`` (32 in the papers) to the
    model's limit for the duration of the block, then restore it."""
    original = getattr(model, "max_seq_length", None)
    limit = model_length_limit(model)
    try:
        if original is not None and limit is not None and limit > original:
            model.max_seq_length = limit
        yield
    finally:
        if original is not None:
            model.max_seq_length = original


def encode_unique(
    model, sentences: Iterable[str], batch_size: int = 64, show_progress_bar: bool = False, whole: bool = True
) -> dict[str, np.ndarray]:
    """Encode each distinct sentence once; returns ``{sentence: float32 embedding}``.

    Args:
        model: a SentenceTransformer.
        sentences: may contain repeats; each distinct one is encoded once.
        batch_size: encoding batch size.
        show_progress_bar: show ST's progress bar.
        whole: encode at the model's full length (see :func:`full_length`); ``False`` keeps ``max_seq_length``.
    """
    unique = list(dict.fromkeys(sentences))
    if not unique:
        return {}
    was_training = getattr(model, "training", False)
    context = full_length(model) if whole else _nullcontext()
    try:
        with context:
            embeddings = model.encode(
                unique, batch_size=batch_size, show_progress_bar=show_progress_bar, convert_to_numpy=True
            )
    finally:
        if was_training:
            model.train()
    embeddings = np.asarray(embeddings, dtype=np.float32)
    return dict(zip(unique, embeddings, strict=True))


@contextmanager
def _nullcontext() -> Iterator[None]:
    yield
