"""Helpers shared by every evaluation: whole-sentence encoding, one encode per distinct sentence, task lists."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np

from st_hardneg.models import model_length_limit

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer


@contextmanager
def full_length(model: SentenceTransformer) -> Iterator[None]:
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


class DegenerateEmbeddingsError(ValueError):
    """The model's embeddings carry no information (non-finite, zero or collapsed to one point): any score would be
    meaningless (``nan``, rank noise, or a "perfect" alignment), so evaluations refuse them."""


#: a model is *collapsed* when its embeddings of distinct sentences all lie within this relative distance of their
#: mean: ``max_i ||x_i - mean|| / mean_i ||x_i|| < COLLAPSE_TOLERANCE``. Measured on 300 Wikipedia sentences,
#: all-MiniLM-L6-v2 spreads by 0.84, and even the tiny random BERT of the tests with CLS pooling (embeddings that
#: share one large common direction) by 4e-3; below 1e-4 the embeddings are one point plus noise (pairwise cosines
#: above 1 - 2e-8, under float32's resolution at 1), and a score computed from them only ranks that noise.
COLLAPSE_TOLERANCE = 1e-4


def relative_spread(embeddings: np.ndarray) -> float:
    """``max_i ||x_i - mean|| / mean_i ||x_i||`` of the rows of ``embeddings`` (0 for identical rows; ``inf`` when
    every row is zero), in float64: how far the embeddings are from one point, relative to their size."""
    x = np.asarray(embeddings, dtype=np.float64)
    scale = float(np.linalg.norm(x, axis=1).mean())
    if scale == 0.0:
        return float("inf")
    return float(np.linalg.norm(x - x.mean(axis=0), axis=1).max() / scale)


def check_embeddings(embeddings: np.ndarray, what: str = "the evaluated sentences") -> None:
    """Raise :class:`DegenerateEmbeddingsError` if ``embeddings`` (one row per distinct sentence) contain NaN or
    infinite values, an all-zero row, or (with at least two rows) are collapsed: their :func:`relative_spread` is
    below :data:`COLLAPSE_TOLERANCE` (all rows equal, or equal up to noise)."""
    x = np.asarray(embeddings)
    if x.ndim != 2 or len(x) == 0:
        raise DegenerateEmbeddingsError(f"expected a non-empty 2-d embedding matrix for {what}, got shape {x.shape}")
    bad = ~np.isfinite(x).all(axis=1)
    if bad.any():
        raise DegenerateEmbeddingsError(
            f"the model produced non-finite (NaN or infinite) embeddings for {int(bad.sum())} of {len(x)} distinct "
            f"sentences of {what}; the model's weights or inputs are broken"
        )
    zero = ~np.any(x != 0, axis=1)
    if zero.any():
        raise DegenerateEmbeddingsError(
            f"the model produced all-zero embeddings for {int(zero.sum())} of {len(x)} distinct sentences of {what}; "
            "cosine similarity is undefined for them"
        )
    if len(x) > 1 and np.all(x == x[0]):
        raise DegenerateEmbeddingsError(
            f"the model produced the same embedding for all {len(x)} distinct sentences of {what} (a collapsed or "
            "constant encoder); its scores would be meaningless"
        )
    spread = relative_spread(x) if len(x) > 1 else float("inf")
    if spread < COLLAPSE_TOLERANCE:
        raise DegenerateEmbeddingsError(
            f"the model's embeddings of all {len(x)} distinct sentences of {what} lie within a relative distance of "
            f"{spread:.2g} of their mean (below the collapse tolerance {COLLAPSE_TOLERANCE:g}): a collapsed encoder "
            "whose scores would only rank rounding noise"
        )


def encode_unique(
    model: SentenceTransformer, sentences: Iterable[str], batch_size: int = 64, show_progress_bar: bool = False,
    whole: bool = True, check: bool = True, role: str | None = None, prompt_name: str | None = None,
    desc: str | None = None,
) -> dict[str, np.ndarray]:
    """Encode each distinct sentence once; returns ``{sentence: float32 embedding}``.

    Args:
        model: a SentenceTransformer.
        sentences: may contain repeats; each distinct one is encoded once.
        batch_size: encoding batch size.
        show_progress_bar: show ST's progress bar.
        whole: encode at the model's full length (see :func:`full_length`); ``False`` keeps ``max_seq_length``.
        check: refuse degenerate embeddings (see :func:`check_embeddings`).
        role: ``"query"`` or ``"document"`` encodes with ``model.encode_query`` / ``model.encode_document`` (their
            default prompt and Router task, as mteb encodes a retrieval task); ``None`` = ``model.encode``.
        prompt_name: a prompt of ``model.prompts`` to prepend (``None``: the method's default).
        desc: what the progress bar says (default: ``encoding N queries`` / ``documents`` / ``sentences``), so that
            each encoding of a run can be told apart.

    Raises:
        DegenerateEmbeddingsError: with ``check``, the embeddings are non-finite, zero or collapsed (see
            :func:`check_embeddings`).
        ValueError: an unknown ``role``, or a ``prompt_name`` the model does not define.
    """
    if role not in (None, "query", "document"):
        raise ValueError(f"role must be 'query', 'document' or None, got {role!r}")
    prompts = getattr(model, "prompts", None) or {}
    if prompt_name is not None and prompt_name not in prompts:
        raise ValueError(f"prompt_name {prompt_name!r} is not a prompt of the model; its prompts are "
                         f"{sorted(prompts) or 'none'}")
    encode: Any = {None: model.encode, "query": getattr(model, "encode_query", model.encode),
                   "document": getattr(model, "encode_document", model.encode)}[role]
    unique = list(dict.fromkeys(sentences))
    if not unique:
        return {}
    was_training = getattr(model, "training", False)
    context = full_length(model) if whole else _nullcontext()
    from st_hardneg.models import named_progress

    label = desc or f"encoding {len(unique):,} {'sentence' if role is None else role}s"
    try:
        with context, named_progress(label):
            extra = {"prompt_name": prompt_name} if prompt_name is not None else {}
            embeddings = encode(
                unique, batch_size=batch_size, show_progress_bar=show_progress_bar, convert_to_numpy=True, **extra
            )
    finally:
        if was_training:
            model.train()
    embeddings = np.asarray(embeddings, dtype=np.float32)
    if check:
        check_embeddings(embeddings)
    return dict(zip(unique, embeddings, strict=True))


@contextmanager
def _nullcontext() -> Iterator[None]:
    yield


def parse_task_list(tasks: Sequence[str] | str | None, known: Sequence[str] | None, what: str,
                    default: Sequence[str] = ()) -> list[str]:
    """Task names from a list or a comma-separated string, in order, without repeats.

    ``None`` gives ``default``. With ``known``, a name outside it, or an empty list, raises ``ValueError`` naming
    ``what`` ("STS", "transfer") and the choices; ``known=None`` accepts any name (the caller checks them)."""
    if tasks is None:
        return list(default)
    if isinstance(tasks, str):
        tasks = [t.strip() for t in tasks.split(",") if t.strip()]
    if known is not None:
        unknown = [t for t in tasks if t not in known]
        if unknown or not tasks:
            raise ValueError(f"unknown {what} task(s) {unknown}; choose from {', '.join(known)}")
    return list(dict.fromkeys(tasks))
