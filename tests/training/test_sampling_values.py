"""Values taken in the wrong shape are refused where they enter the pair sampling: a string where a collection of
ids is meant (it would be read as its characters), a float id (it would be truncated), a nested list (unhashable),
a negative seed."""

from __future__ import annotations

import pytest

from st_hardneg.training.sampling import sample_training_pairs
from st_hardneg.validation import check_ids, check_known_positives

RELEVANT = {"q1": {"d1", "d2"}, "q2": {"d3"}}


@pytest.mark.parametrize("kwargs, error, fragment", [
    ({"exclude": "q1"}, TypeError, "exclude is the string 'q1', not a collection of ids"),
    ({"exclude": {1.5}}, TypeError, "exclude holds 1.5 (float); ids are strings"),
    ({"exclude": 7}, TypeError, "exclude must be a set (or list) of ids, got int"),
    ({"seed": -1}, ValueError, "seed must be a non-negative integer"),
])
def test_bad_values_are_refused_where_they_enter(kwargs, error, fragment):
    with pytest.raises(error, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        sample_training_pairs(RELEVANT, **kwargs)


def test_a_string_of_relevant_ids_is_not_read_as_its_characters():
    with pytest.raises(TypeError, match=r"relevant\['q1'\] is the string 'd1'"):
        sample_training_pairs({"q1": "d1"})
    with pytest.raises(TypeError, match=r"relevant has the key 3 \(int\)"):
        sample_training_pairs({3: {"d1"}})
    # the same ids as a list or a generator give the same pairs as a set
    assert sample_training_pairs({"q1": ["d1", "d2"]}) == sample_training_pairs({"q1": (d for d in ("d2", "d1"))}) \
        == [("q1", "d1"), ("q1", "d2")]
    assert sample_training_pairs(RELEVANT, exclude=["q1"]) == [("q2", "d3")]


def test_check_ids_and_known_positives_name_nested_values():
    assert check_ids(["a", "b", "a"], "ids") == frozenset({"a", "b"})
    with pytest.raises(TypeError, match=r"ids holds \['a'\] \(list\)"):
        check_ids([["a"]], "ids")
    with pytest.raises(TypeError, match=r"known_positives\['x'\] holds \['y'\] \(list\); the relevant texts are"):
        check_known_positives({"x": [["y"]]})
    # a generator of texts is read once and kept
    assert check_known_positives({"x": (t for t in ("y", "z"))}) == {"x": frozenset({"y", "z"})}


@pytest.mark.parametrize("drop_last, sizes", [(True, [4, 4]), (False, [4, 4, 2])])
def test_the_known_relevance_sampler_yields_as_many_batches_as_it_says(drop_last, sizes):
    from datasets import Dataset

    from st_hardneg.training.sampling import KnownRelevanceBatchSampler

    rows = Dataset.from_dict({"anchor": [f"q{i}" for i in range(10)], "positive": [f"d{i}" for i in range(10)]})
    sampler = KnownRelevanceBatchSampler(rows, batch_size=4, drop_last=drop_last, seed=3)
    batches = list(sampler)
    assert len(sampler) == len(batches) == len(sizes)
    assert sorted(len(batch) for batch in batches) == sorted(sizes)
    if not drop_last:  # every row once
        assert sorted(i for batch in batches for i in batch) == list(range(10))
