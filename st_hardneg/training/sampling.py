"""How retrieval training rows are drawn and batched: :func:`sample_training_pairs` (a split's (query, document)
training pairs by a stated, seeded rule, :data:`PAIR_SAMPLING`) and :class:`KnownRelevanceBatchSampler`
(sentence-transformers' no-duplicates batches that also keep a query's known relevant documents out of its batch;
:func:`known_relevance_sampler` makes it a ``batch_sampler`` training argument). Used by the retrieval recipe
(:mod:`st_hardneg.training.protocol`) and ``benchmarks.retrieval_beir_round2``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

#: how training pairs are drawn from a BEIR training split (``benchmarks.retrieval_beir_round2``): per training query at most
#: ``per_query`` of its relevant documents, chosen by ``seed``; then at most ``max_pairs`` of those pairs, chosen by
#: ``seed``. SciFact (at most 5 judgements a query, 722 training pairs) keeps every judgement; NFCorpus (~43 a query)
#: gets 768 pairs, as many steps as SciFact's run (a CPU run of about 10 minutes on 2 cores)
PAIR_SAMPLING: dict[str, Any] = {"per_query": 5, "max_pairs": 768, "seed": 0}


def _draw_order(seed: int, key: str) -> str:
    import hashlib

    return hashlib.sha256(f"{seed}\t{key}".encode()).hexdigest()


def sample_training_pairs(relevant: Mapping[str, Iterable[str]], *, per_query: int = PAIR_SAMPLING["per_query"],
                          max_pairs: int = PAIR_SAMPLING["max_pairs"], seed: int = PAIR_SAMPLING["seed"],
                          exclude: Iterable[str] = frozenset()) -> list[tuple[str, str]]:
    """The (query id, document id) training pairs of a split by a stated, seeded rule.

    Each query (not in ``exclude``, e.g. the dev and test queries) keeps at most ``per_query`` of its relevant
    documents, those first in a seeded hash order of ``"query<TAB>doc"``; then at most ``max_pairs`` pairs are kept,
    those first in the seeded hash order of the pairs. The draw depends only on the ids and the seed (never on file
    or dict order), so it is reproducible across machines.

    Args:
        relevant: query id → ids of its relevant documents (e.g. ``BEIRData.relevant("train")``).
        per_query: documents kept per query (>= 1).
        max_pairs: pairs kept in all (0 = every drawn pair).
        seed: the hash seed of both draws.
        exclude: query ids never drawn.

    Returns:
        The pairs, sorted by query id then document id.

    Raises:
        ValueError: a bad count, or a rule that leaves no pair (every query excluded or none relevant).

    Example:
        ::

            from st_hardneg.data.beir import load_beir
            from st_hardneg.training.sampling import sample_training_pairs

            nfcorpus = load_beir("path/to/nfcorpus")
            pairs = sample_training_pairs(nfcorpus.relevant("train"), per_query=2, max_pairs=1280, seed=0)
    """
    from st_hardneg import validation

    validation.check_count(per_query, "per_query", minimum=1)
    validation.check_count(max_pairs, "max_pairs", minimum=0)
    validation.check_count(seed, "seed", minimum=0)
    excluded = validation.check_ids(exclude, "exclude")
    if not isinstance(relevant, Mapping):
        raise TypeError(f"relevant must map query ids to their relevant document ids, got {type(relevant).__name__}")
    checked: dict[str, frozenset[str]] = {}
    for query, docs in relevant.items():
        if not isinstance(query, str):
            raise TypeError(f"relevant has the key {query!r} ({type(query).__name__}); query ids are strings")
        checked[query] = validation.check_ids(docs, f"relevant[{query!r}]")
    pairs = []
    for query in sorted(checked):
        if query in excluded:
            continue
        docs = sorted(checked[query], key=lambda d: _draw_order(seed, f"{query}\t{d}"))[:per_query]
        pairs += [(query, doc) for doc in docs]
    if max_pairs and len(pairs) > max_pairs:
        pairs = sorted(pairs, key=lambda p: _draw_order(seed, f"pair\t{p[0]}\t{p[1]}"))[:max_pairs]
    if not pairs:
        raise ValueError(f"the pair-sampling rule (per_query={per_query}, max_pairs={max_pairs}, seed={seed}) leaves "
                         f"no training pair: {len(relevant)} queries with a relevant document, "
                         f"{len(set(checked) & excluded)} of them excluded (dev / test)")
    return sorted(pairs)


#: extra shuffled passes when one pass yields fewer batches than ``len`` (sentence-transformers'
#: ``NoDuplicatesBatchSampler`` does the same, up to its ``_MAX_RESAMPLE_PASSES``)
RESAMPLE_PASSES = 2


class KnownRelevanceBatchSampler:
    """sentence-transformers' ``NoDuplicatesBatchSampler`` that also knows which documents are relevant to which
    query: a row joins a batch only when none of its texts is already in the batch, none of its texts is a known
    relevant document of a query in the batch, and none of the batch's texts is a known relevant document of its
    query. So no in-batch or mined candidate of any row is a document known to be relevant to that row's query
    (known-relevance masking, done where the batch is made, so it holds for every loss).

    The rows are shuffled with the Trainer's generator seeded ``seed + epoch`` and filled greedily in that order, as
    ``NoDuplicatesBatchSampler`` does: with no relevance known, both give the same batches for the same seed (the
    paired data order across rows). Only full batches are yielded (``drop_last``); when a pass yields fewer than
    ``len(dataset) // batch_size`` batches, the rows are reshuffled for more batches (at most :data:`RESAMPLE_PASSES`
    passes), as ``NoDuplicatesBatchSampler`` does.

    Args:
        dataset: the training rows (first column the query text, the others documents).
        batch_size: rows per batch.
        drop_last: must be ``True`` (a partial last batch is never yielded).
        known_relevant: query text → texts of its relevant documents (e.g. ``BEIRRetrieval.known_paraphrases``).
        valid_label_columns, generator, seed: as sentence-transformers passes them.

    Example:
        ::

            from functools import partial
            from st_hardneg.training.protocol import train_config
            from st_hardneg.training.sampling import KnownRelevanceBatchSampler

            sampler = partial(KnownRelevanceBatchSampler, known_relevant=split.known_paraphrases)
            config = train_config("out", extra_args={"batch_sampler": sampler})
    """

    def __init__(self, dataset: Any, batch_size: int, drop_last: bool = True,
                 valid_label_columns: list[str] | None = None, generator: Any = None, seed: int = 0, *,
                 known_relevant: dict[str, set[str]] | None = None) -> None:
        import torch

        from st_hardneg import validation

        validation.check_count(batch_size, "batch_size", minimum=1)
        columns = [c for c in dataset.column_names if c not in set(valid_label_columns or []) | {"dataset_name"}]
        self.rows = [tuple(str(dataset[c][i]) for c in columns) for i in range(len(dataset))] if columns else []
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.known_relevant = known_relevant or {}
        self.generator = generator if generator is not None else torch.Generator()
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        full, rest = divmod(len(self.rows), self.batch_size)
        return full + int(bool(rest) and not self.drop_last)  # drop_last=False: the last, smaller batch counts

    def __iter__(self) -> Any:
        self.generator.manual_seed(self.seed + self.epoch)
        expected = len(self)
        yielded = 0
        for _ in range(1 + RESAMPLE_PASSES):  # sentence-transformers' rule: reshuffle while a pass falls short
            for batch in self._one_pass():
                yield batch
                yielded += 1
                if yielded >= expected:
                    return
            if yielded == 0:
                return

    def _one_pass(self) -> Any:
        import torch

        order = torch.randperm(len(self.rows), generator=self.generator, dtype=torch.int32).tolist()
        remaining = order
        while remaining:
            texts: set[str] = set()
            blocked: set[str] = set()
            batch: list[int] = []
            left: list[int] = []
            for position, index in enumerate(remaining):
                row = self.rows[index]
                own = set(row)
                relevant = self.known_relevant.get(row[0], set())
                if own & texts or own & blocked or relevant & texts:
                    left.append(index)
                    continue
                batch.append(index)
                texts |= own
                blocked |= relevant
                if len(batch) == self.batch_size:
                    left += remaining[position + 1:]
                    break
            if len(batch) < self.batch_size:
                if batch and not self.drop_last and not left:  # every row placed: the last, smaller batch
                    yield batch
                return
            yield batch
            remaining = left


def known_relevance_sampler(known_relevant: dict[str, set[str]]) -> Callable[..., KnownRelevanceBatchSampler]:
    """The ``batch_sampler`` training argument of :class:`KnownRelevanceBatchSampler` with ``known_relevant``
    (pass it as ``train_config(..., extra_args={"batch_sampler": known_relevance_sampler(known)})``)."""
    import functools

    return functools.partial(KnownRelevanceBatchSampler, known_relevant=known_relevant)
