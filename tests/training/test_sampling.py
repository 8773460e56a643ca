"""st_hardneg.training.sampling: the pair-sampling rule (``sample_training_pairs``) and the known-relevance batches
(``KnownRelevanceBatchSampler``) against sentence-transformers' no-duplicates batches."""

from __future__ import annotations

import random

import pytest
import torch

from st_hardneg.training.sampling import KnownRelevanceBatchSampler, sample_training_pairs

# --------------------------------------------------------------------------- pair sampling
RELEVANT = {f"q{i}": {f"d{i}-{k}" for k in range(i % 6 + 1)} for i in range(40)}


def test_pair_sampling_caps_per_query_and_in_all():
    pairs = sample_training_pairs(RELEVANT, per_query=2, max_pairs=0, seed=0)
    expected = sum(min(2, len(docs)) for docs in RELEVANT.values())
    assert len(pairs) == expected == 7 + 2 * 33  # 7 queries (i % 6 == 0) have a single document
    per_query: dict[str, int] = {}
    for query, doc in pairs:
        assert doc in RELEVANT[query]
        per_query[query] = per_query.get(query, 0) + 1
    assert max(per_query.values()) == 2
    assert len(sample_training_pairs(RELEVANT, per_query=2, max_pairs=25, seed=0)) == 25


def test_pair_sampling_is_seeded_reproducible_and_order_free():
    first = sample_training_pairs(RELEVANT, per_query=1, max_pairs=20, seed=3)
    shuffled = dict(sorted(RELEVANT.items(), reverse=True))
    assert sample_training_pairs(shuffled, per_query=1, max_pairs=20, seed=3) == first
    assert sample_training_pairs(RELEVANT, per_query=1, max_pairs=20, seed=4) != first
    assert first == sorted(first)


def test_pair_sampling_excludes_queries_and_refuses_an_empty_rule():
    exclude = {f"q{i}" for i in range(0, 40, 2)}
    pairs = sample_training_pairs(RELEVANT, per_query=3, max_pairs=0, seed=0, exclude=exclude)
    assert {q for q, _ in pairs} == set(RELEVANT) - exclude
    with pytest.raises(ValueError, match="leaves no training pair"):
        sample_training_pairs(RELEVANT, exclude=set(RELEVANT))
    with pytest.raises(ValueError, match="per_query"):
        sample_training_pairs(RELEVANT, per_query=0)


# --------------------------------------------------------------------------- paired data order
def rows_dataset(n: int = 120, seed: int = 0):
    from datasets import Dataset

    rng = random.Random(seed)
    return Dataset.from_dict({"anchor": [f"q{rng.randint(0, 50)}" for _ in range(n)],
                              "positive": [f"d{rng.randint(0, 200)}" for _ in range(n)],
                              "negative": [f"d{rng.randint(201, 400)}" for _ in range(n)]})


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_without_known_relevance_the_batches_are_sentence_transformers_no_duplicates(seed):
    from sentence_transformers.base.sampler import NoDuplicatesBatchSampler

    dataset = rows_dataset()
    theirs = list(NoDuplicatesBatchSampler(dataset, batch_size=8, drop_last=True, generator=torch.Generator(),
                                           seed=seed))
    ours = list(KnownRelevanceBatchSampler(dataset, batch_size=8, drop_last=True, generator=torch.Generator(),
                                           seed=seed))
    assert ours == theirs[:len(ours)] and len(ours) == len(theirs)


def test_known_relevance_batches_hold_no_relevant_document_of_another_row():
    dataset = rows_dataset()
    rng = random.Random(5)
    known = {f"q{i}": {f"d{rng.randint(0, 400)}" for _ in range(12)} for i in range(51)}
    sampler = KnownRelevanceBatchSampler(dataset, batch_size=8, drop_last=True, generator=torch.Generator(), seed=0,
                                         known_relevant=known)
    batches = list(sampler)
    assert len(batches) == len(dataset) // 8 and all(len(b) == 8 for b in batches)
    for batch in batches:
        texts = [t for i in batch for t in (dataset["anchor"][i], dataset["positive"][i], dataset["negative"][i])]
        assert len(texts) == len(set(texts))
        for i in batch:
            others = {t for j in batch if j != i for t in (dataset["positive"][j], dataset["negative"][j])}
            assert not others & known.get(dataset["anchor"][i], set())
    assert list(sampler) == batches  # the same seed and epoch: the same batches
    sampler.set_epoch(1)
    assert list(sampler) != batches
