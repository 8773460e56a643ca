"""Hand computations of the ranking rows of :mod:`st_hardneg.functional.ranking` (blocks, logits, the hardness
penalty, joint and per-direction partitions) and of the InfoNCE helpers of :mod:`st_hardneg.functional.core`."""

from __future__ import annotations

import math

import pytest
import torch

from st_hardneg import functional as fn
from st_hardneg.functional import ranking as fr


def _lse(values: list[float]) -> float:
    top = max(values)
    return top + math.log(sum(math.exp(v - top) for v in values))


SIM = torch.tensor([[0.9, 0.2, -0.1],
                    [0.3, 0.8, 0.4]], dtype=torch.float64)  # 2 rows, positives on the diagonal, 1 extra column


def test_joint_rows_are_log_z_minus_the_positive():
    scale = 10.0
    got = fr.ranking_rows({"query_to_doc": fr.Block(SIM, has_positive=True)}, scale)
    want = [_lse([scale * v for v in SIM[i].tolist()]) - scale * float(SIM[i, i]) for i in range(2)]
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64))


def test_excluded_entries_leave_the_denominator():
    exclude = torch.tensor([[False, True, False], [False, False, False]])
    got = fr.ranking_rows({"query_to_doc": fr.Block(SIM, has_positive=True, exclude=exclude)}, 10.0)
    assert float(got[0]) == pytest.approx(_lse([9.0, -1.0]) - 9.0, rel=1e-12)
    assert float(got[1]) == pytest.approx(_lse([3.0, 8.0, 4.0]) - 8.0, rel=1e-12)


def test_a_chunk_of_rows_reads_its_positive_at_its_offset():
    """Row r of a block with ``row_offset`` o has its positive in column o + r."""
    chunk = SIM[1:]  # the batch's row 1 alone
    got = fr.ranking_rows({"query_to_doc": fr.Block(chunk, has_positive=True, row_offset=1)}, 10.0)
    assert float(got[0]) == pytest.approx(_lse([3.0, 8.0, 4.0]) - 8.0, rel=1e-12)


def test_per_direction_averages_one_denominator_per_block():
    d2q = torch.tensor([[0.7, 0.1], [0.0, 0.6]], dtype=torch.float64)
    blocks = {"query_to_doc": fr.Block(SIM, has_positive=True), "doc_to_query": fr.Block(d2q, has_positive=True)}
    scale = 5.0
    got = fr.ranking_rows(blocks, scale, "per_direction")
    for i in range(2):
        first = _lse([scale * v for v in SIM[i].tolist()]) - scale * float(SIM[i, i])
        second = _lse([scale * v for v in d2q[i].tolist()]) - scale * float(d2q[i, i])
        assert float(got[i]) == pytest.approx((first + second) / 2, rel=1e-12)
    joint = fr.ranking_rows(blocks, scale, "joint")
    for i in range(2):
        values = [scale * v for v in SIM[i].tolist() + d2q[i].tolist()]
        assert float(joint[i]) == pytest.approx(_lse(values) - scale * float(SIM[i, i]), rel=1e-12)


def test_focal_logits_square_the_positive_and_shift_the_negatives():
    m, scale = 0.3, 2.0
    block = fr.Block(SIM, has_positive=True)
    logits = fr.block_logits(block, scale, focal_m=m)
    for i in range(2):
        for c in range(3):
            s = float(SIM[i, c])
            want = s * s * scale if c == i else s * (s + m) * scale
            assert float(logits[i, c]) == pytest.approx(want, rel=1e-12)


def test_focal_logits_gradient_is_the_derivative_of_the_modulation():
    sim = SIM.clone().requires_grad_(True)
    m, scale = 0.3, 2.0
    fr.block_logits(fr.Block(sim, has_positive=True), scale, focal_m=m).sum().backward()
    for i in range(2):
        for c in range(3):
            s = float(SIM[i, c])
            want = 2 * s * scale if c == i else (2 * s + m) * scale
            assert float(sim.grad[i, c]) == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize(("mode", "selected"), [
    # columns: [positive 0, positive 1, negative of pair 0, negative of pair 1]
    ("in_batch_negatives", [[False, True, False, True], [True, False, True, False]]),
    ("hard_negatives", [[False, False, True, False], [False, False, False, True]]),
    ("all_negatives", [[False, True, True, True], [True, False, True, True]]),
])
def test_hardness_penalty_is_strength_times_the_detached_similarity_on_the_chosen_negatives(mode, selected):
    sim = torch.tensor([[0.9, 0.2, 0.5, -0.3], [0.1, 0.8, 0.4, 0.6]], dtype=torch.float64, requires_grad=True)
    penalty = fr.hardness_penalty(sim, 2, mode, 4.0)
    want = torch.where(torch.tensor(selected), 4.0 * sim.detach(), torch.zeros_like(sim))
    torch.testing.assert_close(penalty, want)
    assert not penalty.requires_grad
    assert fr.hardness_penalty(sim, 2, mode, 0.0) is None and fr.hardness_penalty(sim, 2, None, 4.0) is None


def test_the_penalty_is_added_after_the_scaling():
    penalty = torch.tensor([[0.0, 1.5, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    logits = fr.block_logits(fr.Block(SIM, has_positive=True, penalty=penalty), 10.0)
    assert float(logits[0, 1]) == pytest.approx(10.0 * 0.2 + 1.5, rel=1e-12)


def test_with_columns_appends_a_papers_negatives_and_their_exclusions():
    block = fr.Block(SIM[:, :2], has_positive=True)
    extra = torch.tensor([[0.5], [0.6]], dtype=torch.float64)
    grown = block.with_columns(extra, torch.tensor([[True], [False]]))
    assert grown.similarity.tolist() == [[0.9, 0.2, 0.5], [0.3, 0.8, 0.6]]
    assert grown.exclude.tolist() == [[False, False, True], [False, False, False]]
    with pytest.raises(ValueError, match="extra columns have 1 rows, the block has 2"):
        block.with_columns(extra[:1])


def test_own_pair_mask_marks_every_column_of_the_rows_pair():
    assert fr.own_pair_mask(2, 6).tolist() == [[True, False, True, False, True, False],
                                               [False, True, False, True, False, True]]
    assert fr.own_pair_mask(2, 4, rows=(1, 2)).tolist() == [[False, True, False, True]]


def test_info_nce_rows_is_the_cross_entropy_with_target_the_row():
    logits = torch.tensor([[2.0, 1.0, 0.0], [0.5, 3.0, -1.0]], dtype=torch.float64)
    got = fn.info_nce_rows(logits)
    torch.testing.assert_close(got, torch.tensor([_lse([2.0, 1.0, 0.0]) - 2.0, _lse([0.5, 3.0, -1.0]) - 3.0],
                                                 dtype=torch.float64))
    assert float(fn.info_nce(logits)) == pytest.approx(float(got.mean()), rel=1e-12)


def test_masked_columns_are_minus_infinity_and_trailing_columns_are_kept():
    logits = torch.zeros(2, 3)
    got = fn.mask_columns(logits, torch.tensor([[True, False], [False, True]]))
    assert got.tolist() == [[-math.inf, 0.0, 0.0], [0.0, -math.inf, 0.0]]
    assert fn.mask_columns(logits, None) is logits
