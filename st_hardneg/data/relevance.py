"""Known relevance: which texts the data already says are relevant to an anchor, as one mapping.

Retrieval data is many-to-many: a query has several relevant documents, so a batch of (query, document) pairs holds
candidates that the qrels mark relevant to another row's query (in NFCorpus train, batches of 32 with two judgements
per query, 28.5 % of the rows have one). This module builds the mapping ``{anchor text: frozenset of relevant
texts}`` that both sides of training read:

- every loss's ``known_positives`` argument masks, for each anchor, the in-batch, gathered and queued candidates the
  mapping marks relevant to it (:class:`st_hardneg.losses.relevance.KnownPositives`);
- hard-negative mining never picks them as an anchor's negative
  (``st_hardneg.data.mining.mine_training_negatives(..., known_positives=...)``).

Example::

    from st_hardneg.data.beir import load_beir
    from st_hardneg.data.relevance import known_positives_from_qrels

    data = load_beir("scifact")
    known = known_positives_from_qrels(data.queries, data.corpus, data.qrels["train"])
    loss = MixCSELoss(model, known_positives=known)
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from st_hardneg.validation import check_known_positives

__all__ = ["known_positives_from_groups", "known_positives_from_qrels"]


def _relevant_ids(judged: Any, query: str, min_score: float) -> list[str]:
    """The document ids of one qrels entry: a mapping ``doc id -> score`` (kept when ``score >= min_score``) or a
    collection of doc ids."""
    if isinstance(judged, str | bytes):
        raise TypeError(f"qrels[{query!r}] is the string {judged!r}, not document ids: a string would be read as its "
                        f"characters; write {{{judged!r}}} or {{{judged!r}: 1}}")
    if isinstance(judged, Mapping):
        ids = []
        for doc, score in judged.items():
            if isinstance(score, bool) or not isinstance(score, int | float):
                raise TypeError(f"qrels[{query!r}][{doc!r}] is {score!r}; a relevance score is a number")
            if score >= min_score:
                ids.append(doc)
    elif isinstance(judged, Iterable):
        ids = list(judged)
    else:
        raise TypeError(f"qrels[{query!r}] must map document ids to scores (or be a set of document ids), got "
                        f"{type(judged).__name__}")
    bad = next((doc for doc in ids if not isinstance(doc, str)), None)
    if bad is not None:
        raise TypeError(f"qrels[{query!r}] holds the document id {bad!r} ({type(bad).__name__}); ids are strings, as "
                        "in BEIR's files")
    return ids


def known_positives_from_qrels(queries: Mapping[str, str], corpus: Mapping[str, str], qrels: Mapping[str, Any], *,
                               min_score: float = 1) -> dict[str, frozenset[str]]:
    """Query text → the texts of its relevant documents, from BEIR-style id tables and relevance judgements.

    Args:
        queries: query id → query text (``BEIRData.queries``).
        corpus: document id → the document's text as it is trained on (``BEIRData.corpus``: ``"title text"``).
        qrels: query id → document id → score (``BEIRData.qrels[split]``), or query id → a set of relevant document
            ids (``BEIRData.relevant(split)``).
        min_score: the smallest score that counts as relevant (default 1; BEIR's qrels hold 0 for judged
            non-relevant).

    Returns:
        ``{query text: frozenset of document texts}``, the ``known_positives`` of every loss and of
        :func:`st_hardneg.data.mining.mine_training_negatives`. Queries that share a text share their documents.

    Raises:
        TypeError: a table is not a mapping, an id is not a string, a text is not a string, or a score is not a
            number (the message names the entry).

    A judgement whose query id is not in ``queries`` or whose document id is not in ``corpus`` cannot be translated
    to texts: such judgements are skipped, counted and reported in one warning. An empty result warns (nothing can be
    masked).
    """
    for table, name in ((queries, "queries"), (corpus, "corpus"), (qrels, "qrels")):
        if not isinstance(table, Mapping):
            raise TypeError(f"{name} must be a mapping of ids (strings), got {type(table).__name__}")
    out: dict[str, set[str]] = {}
    missing_queries: list[str] = []
    missing_docs: list[str] = []
    for query, judged in qrels.items():
        if not isinstance(query, str):
            raise TypeError(f"qrels has the query id {query!r} ({type(query).__name__}); ids are strings, as in "
                            "BEIR's files")
        docs = _relevant_ids(judged, query, min_score)
        text = queries.get(query)
        if text is None:
            missing_queries.append(query)
            continue
        if not isinstance(text, str):
            raise TypeError(f"queries[{query!r}] is {type(text).__name__}, not a text")
        for doc in docs:
            document = corpus.get(doc)
            if document is None:
                missing_docs.append(doc)
                continue
            if not isinstance(document, str):
                raise TypeError(f"corpus[{doc!r}] is {type(document).__name__}, not a text")
            out.setdefault(text, set()).add(document)
    if missing_queries or missing_docs:
        parts = []
        if missing_queries:
            parts.append(f"{len(missing_queries)} query id(s) absent from queries (e.g. {missing_queries[0]!r})")
        if missing_docs:
            parts.append(f"{len(missing_docs)} judgement(s) naming a document id absent from corpus (e.g. "
                         f"{missing_docs[0]!r})")
        warnings.warn("known_positives_from_qrels: " + " and ".join(parts) + " never occur in the data; those "
                      "judgements are skipped", UserWarning, stacklevel=2)
    return check_known_positives(out)


def known_positives_from_groups(texts: Sequence[str], groups: Sequence[Any]) -> dict[str, frozenset[str]]:
    """Text → the other texts of its group, from a group column (``groups[i]`` is the group of ``texts[i]``; e.g. a
    cluster or paraphrase-set id). Every text of a group is a known positive of every other one.

    Raises:
        ValueError: ``texts`` and ``groups`` differ in length.
        TypeError: a text is not a string, or a group id is ``None`` or unhashable.
    """
    if isinstance(texts, str) or isinstance(groups, str):
        raise TypeError("texts and groups must be sequences (one group id per text), not strings")
    texts, groups = list(texts), list(groups)
    if len(texts) != len(groups):
        raise ValueError(f"texts and groups must have one group id per text, got {len(texts)} texts and "
                         f"{len(groups)} group ids")
    members: dict[Any, set[str]] = {}
    for index, (text, group) in enumerate(zip(texts, groups, strict=True)):
        if not isinstance(text, str):
            raise TypeError(f"texts[{index}] is {text!r} ({type(text).__name__}); texts are strings")
        if group is None:
            raise TypeError(f"groups[{index}] is None; every text needs a group id")
        try:
            members.setdefault(group, set()).add(text)
        except TypeError:
            raise TypeError(f"groups[{index}] is {group!r} ({type(group).__name__}), not hashable") from None
    out: dict[str, set[str]] = {}
    for group_texts in members.values():
        for text in group_texts:
            others = group_texts - {text}
            if others:
                out.setdefault(text, set()).update(others)
    return check_known_positives(out)
