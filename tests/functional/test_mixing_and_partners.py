"""Hand computations of the mixing, the partners and the top-k choices of :mod:`st_hardneg.functional` (small
integers and unit vectors worked out in the test, never the function's own formula)."""

from __future__ import annotations

import math

import pytest
import torch

from st_hardneg import functional as fn


def test_mix_is_the_normalised_weighted_sum_of_the_directions():
    a, b = torch.tensor([[3.0, 0.0]]), torch.tensor([[0.0, 5.0]])  # directions (1, 0) and (0, 1)
    got = fn.mix(a, b, 0.75)
    want = torch.tensor([[0.75, 0.25]]) / math.hypot(0.75, 0.25)
    torch.testing.assert_close(got, want)
    # one weight per mixture (a tensor), broadcast over the rows
    weights = torch.tensor([[1.0], [0.0], [0.5]])
    rows = fn.mix(a.expand(3, 2), b.expand(3, 2), weights)
    torch.testing.assert_close(rows, torch.tensor([[1.0, 0.0], [0.0, 1.0], [2 ** -0.5, 2 ** -0.5]]))


def test_mix_with_assume_normalized_skips_the_input_normalisation():
    a, b = torch.tensor([[2.0, 0.0]]), torch.tensor([[0.0, 1.0]])
    # taken as given: 0.5·(2, 0) + 0.5·(0, 1) = (1, 0.5), then normalised
    torch.testing.assert_close(fn.mix(a, b, 0.5, assume_normalized=True),
                               torch.tensor([[1.0, 0.5]]) / math.hypot(1.0, 0.5))


def test_shift_partners_are_the_next_row_and_never_the_row_itself():
    assert fn.partner_indices(4, "shift").tolist() == [1, 2, 3, 0]
    with pytest.raises(ValueError, match="at least 2"):
        fn.partner_indices(1, "shift")


def test_random_partners_are_one_cycle_without_fixed_points():
    g = torch.Generator().manual_seed(3)
    partners = fn.partner_indices(7, "random", generator=g)
    assert all(int(partners[i]) != i for i in range(7))
    seen, i = set(), 0
    for _ in range(7):  # a single 7-cycle: walking the partners visits every row once
        seen.add(i)
        i = int(partners[i])
    assert seen == set(range(7)) and i == 0


def test_hardest_partner_is_the_most_similar_other_candidate():
    similarity = torch.tensor([[9.0, 0.2, 0.7, 0.1],
                               [0.3, 9.0, 0.1, 0.8],
                               [0.5, 0.6, 9.0, 0.4],
                               [0.9, 0.1, 0.2, 9.0]])  # the diagonal (each row's positive) is never chosen
    assert fn.partner_indices(4, "hardest", similarity=similarity).tolist() == [2, 3, 1, 0]
    assert fn.hardest_negatives(similarity, 2).tolist() == [[2, 1], [3, 0], [1, 0], [0, 2]]
    with pytest.raises(ValueError, match="between 1 and the number of in-batch negatives \\(3\\)"):
        fn.hardest_negatives(similarity, 4)


def test_allowed_partners_walk_on_cyclically_past_excluded_rows():
    partners = torch.tensor([1, 2, 0])
    exclude = torch.tensor([[True, True, False],    # row 0: 1 excluded -> 2
                            [False, True, True],    # row 1: 2 excluded -> 0
                            [True, True, True]])    # row 2: nothing allowed
    got, valid = fn.allowed_partners(partners, exclude)
    assert got[:2].tolist() == [2, 0] and valid.tolist() == [True, True, False]


def test_top_candidates_skip_the_excluded_and_say_where_too_few_are_left():
    similarity = torch.tensor([[0.1, 0.9, 0.5, 0.7],
                               [0.4, 0.3, 0.2, 0.1]])
    exclude = torch.tensor([[False, True, False, False],
                            [True, True, True, False]])
    indices, valid = fn.top_candidates(similarity, 2, exclude)
    assert indices[0].tolist() == [3, 2] and valid[0].tolist() == [True, True]
    assert int(indices[1, 0]) == 3 and valid[1].tolist() == [True, False]


def test_distinct_pairs_are_distinct_and_cover_every_ordered_pair():
    g = torch.Generator().manual_seed(0)
    first, second = fn.sample_distinct_pairs(1, 3, 600, generator=g)
    pairs = set(zip(first[0].tolist(), second[0].tolist(), strict=True))
    assert all(a != b for a, b in pairs)
    assert pairs == {(a, b) for a in range(3) for b in range(3) if a != b}  # all k (k - 1) = 6 of them


def test_hard_negative_mixtures_mix_the_drawn_parents_of_each_row():
    """Each mixture of row i is ``normalize(α Ĝ_a + (1-α) Ĝ_b)`` of two of its hard negatives; with k = 2 the only
    pairs are (first, second) and (second, first)."""
    pool = torch.eye(3)
    hard = torch.tensor([[1, 2], [0, 2], [0, 1]])
    mixtures = fn.mix_hard_negatives(pool, hard, num_mixed=4, alpha=0.8, generator=torch.Generator().manual_seed(1))
    assert mixtures.shape == (3, 4, 3)
    norm = math.hypot(0.8, 0.2)
    for row, (p, q) in enumerate(hard.tolist()):
        one = torch.zeros(3)
        one[p], one[q] = 0.8 / norm, 0.2 / norm
        other = torch.zeros(3)
        other[p], other[q] = 0.2 / norm, 0.8 / norm
        for mixture in mixtures[row]:
            assert torch.allclose(mixture, one, atol=1e-6) or torch.allclose(mixture, other, atol=1e-6)


def test_single_hard_negatives_are_the_top_k_rows_themselves():
    anchors = torch.eye(3)
    pool = torch.tensor([[1.0, 0.0, 0.2], [0.6, 1.0, 0.0], [0.3, 0.1, 1.0]])
    # the other candidates' cosines: anchor 0: p1 0.51, p2 0.29; anchor 1: p0 0, p2 0.10; anchor 2: p0 0.20, p1 0
    got = fn.hard_negative_mixing(anchors, pool, k=1, num_mixed=1, single=True)
    unit = pool / pool.norm(dim=1, keepdim=True)
    assert got.shape == (3, 1, 3)
    torch.testing.assert_close(got[:, 0], unit[[1, 2, 0]])


def test_adaptive_alpha_maps_the_parents_cosine_linearly_to_half_and_one():
    cosines = torch.tensor([1.0, 0.0, -1.0, 3.0])
    torch.testing.assert_close(fn.adaptive_alpha(cosines), torch.tensor([0.5, 0.75, 1.0, 0.5]))
