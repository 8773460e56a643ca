"""Mining hard negatives for (anchor, positive) training pairs, and a cache for mined training sets.

:func:`mine_training_negatives` wraps sentence-transformers' ``mine_hard_negatives`` with the checks a leak-free
training set needs (forbidden sentences, known paraphrases); :func:`cached_dataset` stores what was mined once as a
JSON file keyed by everything that determines it, so a benchmark mines once per model and setting.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from st_hardneg.data.senteval import check_texts

if TYPE_CHECKING:
    from datasets import Dataset
    from sentence_transformers import SentenceTransformer

logger = logging.getLogger(__name__)


def file_digest(paths: Iterable[str | Path]) -> str:
    """SHA-256 (first 12 hex digits) of the files' bytes, in order: part of a cache key that follows the data."""
    digest = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as handle:  # in chunks: a large corpus is never held in memory to be hashed
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()[:12]


def cached_dataset(cache_dir: str | Path, prefix: str, key: dict[str, Any], build: Callable[[], Any]
                   ) -> tuple[Dataset, Path, float]:
    """The ``datasets.Dataset`` stored under ``key`` in ``cache_dir``, or ``build()``'s, stored there first.

    The file is ``<cache_dir>/<prefix>-<sha256(key)[:12]>.json`` (written atomically), holding the key, the build
    time in seconds and the columns.

    Args:
        cache_dir: the cache folder (``~`` expanded, created when needed).
        prefix: file-name prefix.
        key: JSON values that determine the dataset (model, settings, data digest …).
        build: makes the dataset when it is not cached.

    Returns:
        ``(dataset, path, seconds)``: the dataset, its cache file and how long building it took (when it was built).

    A cache file that cannot be read (not JSON, not UTF-8, missing fields) is named in a warning (``warnings`` and
    ``logging``) and rebuilt.
    """
    from datasets import Dataset

    name = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    path = Path(cache_dir).expanduser() / f"{prefix}-{name}.json"
    if path.is_file():
        try:
            cached = json.loads(path.read_text(encoding="utf8"))
            columns, seconds = cached["columns"], cached["seconds"]
            if not isinstance(columns, dict) or not isinstance(seconds, int | float):
                raise TypeError(f"'columns' is a {type(columns).__name__}, 'seconds' a {type(seconds).__name__}")
            return Dataset.from_dict(columns), path, float(seconds)
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
            # a damaged cache (an interrupted copy, a hand edit) costs a rebuild, never the run
            message = (f"unreadable cache file {path} ({type(exc).__name__}: {exc}); building the dataset again "
                       "and replacing it")
            logger.warning(message)
            warnings.warn(message, UserWarning, stacklevel=2)
    start = time.perf_counter()
    dataset = build()
    seconds = round(time.perf_counter() - start, 1)
    from st_hardneg.reporting import write_text

    # atomically, inside the cache folder: a temporary file created exclusively, never through a link
    write_text(path, json.dumps({"key": key, "seconds": seconds, "columns": dataset.to_dict()}), path.parent)
    return dataset, path, seconds


def mine_training_negatives(
    model: SentenceTransformer,
    pairs: Sequence[tuple[str, str]] | Any,
    corpus: Sequence[str],
    *,
    known_positives: dict[str, set[str]] | None = None,
    forbidden: Iterable[str] | None = None,
    num_candidates: int = 5,
    relative_margin: float | None = 0.05,
    range_min: int = 0,
    range_max: int | None = None,
    known_as_positives: bool = False,
    batch_size: int = 64,
    verbose: bool = False,
    query_prompt_name: str | None = None,
    corpus_prompt_name: str | None = None,
) -> Dataset:
    """One mined hard negative per (anchor, positive) pair, with sentence-transformers' ``mine_hard_negatives``.

    ``mine_hard_negatives`` ranks ``corpus`` by cosine to each anchor and keeps the ``num_candidates`` best
    candidates ("top" sampling) that pass its filters; by default ``relative_margin=0.05``, NV-Retriever's
    TopK-PercPos (95 %) rule: a candidate must score below 95 % of the anchor-positive score, which removes most
    unlabelled paraphrases (false negatives). Among those candidates, the first one that is not the anchor, not the
    positive, not a labelled paraphrase of the anchor (``known_positives``) and not ``forbidden`` becomes the
    negative. Pairs with no valid candidate are dropped.

    With ``known_as_positives``, ``mine_hard_negatives`` is given every known positive of an anchor as one of its
    positives, so they leave the ranking before the candidate range is taken: the first candidate is the hardest
    corpus text that is none of them, and a pair is never dropped because its best candidates were all known
    relevant (on NFCorpus, some 43 judged documents a query). As ``mine_hard_negatives`` does with several positives,
    a margin is then relative to the anchor's lowest-scoring known positive.

    Args:
        model: the SentenceTransformer that ranks the candidates (the model to be trained, before training).
        pairs: (anchor, positive) tuples or a ``datasets.Dataset`` whose first two columns are anchor, positive.
        corpus: candidate negatives (e.g. :attr:`MRPCRetrieval.train_corpus`; never test sentences).
        known_positives: text → texts known to be its paraphrases (never used as its negative).
        forbidden: texts that must never be a negative (e.g. the test task's sentences); ``ValueError`` if any is in
            ``corpus`` or ``pairs``, since they should have been removed before mining.
        num_candidates: candidates per anchor passed on by ``mine_hard_negatives``.
        relative_margin, range_min, range_max: as in ``mine_hard_negatives`` (``range_max`` default:
            ``num_candidates + range_min + 10``).
        known_as_positives: rank past ``known_positives`` (above) instead of skipping them among the candidates.
        batch_size: encoding batch size.
        verbose: print ``mine_hard_negatives``' statistics.
        query_prompt_name, corpus_prompt_name: prompts of ``model.prompts`` for the anchors and the corpus, passed to
            ``mine_hard_negatives`` (which encodes with ``encode_query`` / ``encode_document``; ``None``: their
            default prompts, as mteb and the evaluation use).

    Returns:
        ``datasets.Dataset`` with columns ``anchor``, ``positive``, ``negative`` (pairs in input order).

    Raises:
        TypeError: ``pairs`` is not a sequence of 2-item pairs of strings, ``corpus`` holds a non-string (the
            message names the index; texts are never converted with ``str``), or ``known_positives`` is not a
            mapping of texts to collections of texts (a string value would be read as its characters).
        ValueError: an empty text, no pair, a corpus of fewer than 2 sentences, a forbidden sentence, a bad
            candidate range, a prompt name the model does not define, or ``known_as_positives`` not a bool or without
            ``known_positives``.
    """
    from datasets import Dataset
    from sentence_transformers.util import mine_hard_negatives

    from st_hardneg.validation import check_bool

    if num_candidates < 1:
        raise ValueError(f"num_candidates must be >= 1, got {num_candidates!r}")
    check_bool(known_as_positives, "known_as_positives")
    if known_as_positives and not known_positives:
        raise ValueError("known_as_positives=True ranks past the known positives, but none were given "
                         "(known_positives)")
    for what, prompt_name in (("query_prompt_name", query_prompt_name), ("corpus_prompt_name", corpus_prompt_name)):
        prompts = (getattr(model, "prompts", None) or {}) if prompt_name is not None else {}
        if prompt_name is not None and prompt_name not in prompts:
            raise ValueError(f"{what} {prompt_name!r} is not a prompt of the model; its prompts are "
                             f"{sorted(prompts) or 'none'}")
    if isinstance(pairs, Dataset):
        if len(pairs.column_names) < 2:
            raise ValueError(f"pairs needs two columns (anchor, positive), got {pairs.column_names}")
        first, second = pairs.column_names[:2]
        pairs = list(zip(pairs[first], pairs[second], strict=True))
    if isinstance(pairs, str | bytes):
        raise TypeError(f"pairs must be a list of (anchor, positive) pairs of strings, got a {type(pairs).__name__}")
    pairs = list(pairs)
    for index, pair in enumerate(pairs):
        if isinstance(pair, str | bytes) or not isinstance(pair, Sequence) or len(pair) != 2:
            raise TypeError(f"pairs[{index}] must be an (anchor, positive) pair of strings, got {pair!r:.80}")
    check_texts([a for a, _ in pairs], "the anchors of pairs", allow_empty_list=True)
    check_texts([p for _, p in pairs], "the positives of pairs", allow_empty_list=True)
    pairs = [(a, p) for a, p in pairs]
    if not pairs:
        raise ValueError("no (anchor, positive) pair to mine negatives for")
    corpus = list(dict.fromkeys(check_texts(corpus, "corpus", allow_empty_list=True)))
    if len(corpus) < 2:
        raise ValueError(f"the mining corpus needs at least 2 sentences, got {len(corpus)}")
    forbidden = set(forbidden or ())
    leaked = sorted(forbidden.intersection(corpus) | forbidden.intersection(s for pair in pairs for s in pair))
    if leaked:
        raise ValueError(f"{len(leaked)} forbidden sentence(s) in the pairs or the mining corpus, e.g. {leaked[0]!r}")
    if known_positives:  # a string value would be read as its characters (the message names the entry)
        from st_hardneg.validation import check_known_positives

        known_positives = check_known_positives(known_positives)  # type: ignore[assignment]
    elif known_positives is not None and not isinstance(known_positives, Mapping):
        raise TypeError(f"known_positives must map anchor texts to sets of texts, got {type(known_positives).__name__}")
    known_positives = known_positives or {}
    rows = pairs
    if known_as_positives:  # each anchor once, with its pairs' positives and every known one (sorted)
        positives_of: dict[str, set[str]] = {}
        for anchor, positive in pairs:
            positives_of.setdefault(anchor, set()).add(positive)
        rows = [(anchor, text) for anchor, own in positives_of.items()
                for text in sorted(own | set(known_positives.get(anchor, ())))]
    if range_max is None:
        range_max = range_min + num_candidates + 10
    range_max = min(range_max, len(corpus) + len(rows))
    if range_max - range_min < num_candidates:
        raise ValueError(f"range_max - range_min must leave at least num_candidates={num_candidates} candidates, "
                         f"got range_min={range_min}, range_max={range_max}")
    from st_hardneg.models import named_progress

    dataset = Dataset.from_dict({"anchor": [a for a, _ in rows], "positive": [p for _, p in rows]})
    with named_progress(f"mining: encoding {len(pairs):,} pairs and {len(corpus):,} corpus texts"):
        mined = mine_hard_negatives(
            dataset, model, corpus=corpus, range_min=range_min, range_max=range_max,
            relative_margin=relative_margin, num_negatives=num_candidates, sampling_strategy="top",
            output_format="triplet", batch_size=batch_size, verbose=verbose, query_prompt_name=query_prompt_name,
            corpus_prompt_name=corpus_prompt_name,
        )
    # triplet rows come per anchor in decreasing similarity of the negative; candidates without a valid score are
    # already left out
    candidates: dict[tuple[str, str], list[str]] = {}
    for anchor, positive, negative in zip(mined["anchor"], mined["positive"], mined["negative"], strict=True):
        candidates.setdefault((anchor, positive), []).append(negative)
    anchors, positives, negatives = [], [], []
    for anchor, positive in pairs:
        for negative in candidates.get((anchor, positive), []):
            if negative in (anchor, positive) or negative in known_positives.get(anchor, ()):
                continue
            anchors.append(anchor)
            positives.append(positive)
            negatives.append(negative)
            break
    return Dataset.from_dict({"anchor": anchors, "positive": positives, "negative": negatives})
