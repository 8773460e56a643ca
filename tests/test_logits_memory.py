"""The ranking rows' logits are built in one buffer per block (issue 21): Focal-InfoNCE's transform keeps only the
similarity for its backward, the later steps run in place, and none of it touches the caller's similarity."""

from __future__ import annotations

import pytest
import torch

from st_hardneg.functional import ranking as fr


def _focal_reference(sim: torch.Tensor, m: float, scale: float, rows_with_positive: bool, offset: int = 0):
    """Focal-InfoNCE's logits from the paper's equations, entry by entry."""
    out = torch.empty_like(sim)
    for r in range(sim.size(0)):
        for c in range(sim.size(1)):
            s = sim[r, c]
            out[r, c] = (s * s if rows_with_positive and c == r + offset else s * (s + m)) * scale
    return out


@pytest.mark.parametrize("has_positive", [True, False])
@pytest.mark.parametrize("offset", [0, 2])
def test_focal_logits_match_the_equations_and_their_gradient(has_positive, offset):
    torch.manual_seed(0)
    sim = (torch.rand(3, 7, dtype=torch.float64) * 2 - 1).requires_grad_()
    block = fr.Block(sim, has_positive=has_positive, row_offset=offset)
    logits = fr.block_logits(block, scale=20.0, focal_m=0.3)
    expected = _focal_reference(sim.detach(), 0.3, 20.0, has_positive, offset)
    torch.testing.assert_close(logits.detach(), expected, rtol=1e-12, atol=1e-12)
    # the gradient, against the derivative of the equations: (2s + m)·scale, 2s·scale at the positives
    weights = torch.randn(3, 7, dtype=torch.float64)
    (logits * weights).sum().backward()
    slope = (2 * sim.detach() + 0.3) * 20.0
    if has_positive:
        rows = torch.arange(3)
        slope[rows, rows + offset] = 2 * sim.detach()[rows, rows + offset] * 20.0
    torch.testing.assert_close(sim.grad, slope * weights, rtol=1e-12, atol=1e-12)


def test_focal_logits_pass_gradcheck():
    torch.manual_seed(1)
    sim = (torch.rand(4, 6, dtype=torch.float64) * 2 - 1).requires_grad_()
    rows = torch.arange(4)
    assert torch.autograd.gradcheck(lambda s: fr._FocalLogits.apply(s, rows, rows + 1, 0.3, 20.0), (sim,))
    assert torch.autograd.gradcheck(lambda s: fr._FocalLogits.apply(s, None, None, 0.3, 20.0), (sim,))


@pytest.mark.parametrize("focal_m", [None, 0.3])
@pytest.mark.parametrize("partition_mode", ["joint", "per_direction"])
def test_ranking_rows_leave_the_similarities_untouched_and_match_a_cross_entropy(focal_m, partition_mode):
    torch.manual_seed(2)
    q2d = torch.rand(4, 8) * 2 - 1
    d2q = torch.rand(4, 4) * 2 - 1
    exclude = torch.zeros(4, 8, dtype=torch.bool)
    exclude[0, 5] = True
    penalty = torch.rand(4, 8)
    blocks = {"query_to_doc": fr.Block(q2d.clone(), has_positive=True, exclude=exclude, penalty=penalty),
              "doc_to_query": fr.Block(d2q.clone(), has_positive=True)}
    rows = fr.ranking_rows(blocks, 20.0, partition_mode, focal_m)
    # the blocks the caller holds are unchanged (the in-place steps act on fresh buffers only)
    assert torch.equal(blocks["query_to_doc"].similarity, q2d)
    assert torch.equal(blocks["doc_to_query"].similarity, d2q)

    def logits(sim):
        if focal_m is None:
            return sim * 20.0
        return _focal_reference(sim, focal_m, 20.0, True)

    a = (logits(q2d) + penalty).masked_fill(exclude, float("-inf"))
    b = logits(d2q)
    target = torch.arange(4)
    if partition_mode == "joint":
        expected = torch.nn.functional.cross_entropy(torch.cat([a, b], dim=1), target, reduction="none")
    else:
        expected = (torch.nn.functional.cross_entropy(a, target, reduction="none")
                    + torch.nn.functional.cross_entropy(b, target, reduction="none")) / 2
    torch.testing.assert_close(rows, expected, rtol=1e-5, atol=1e-5)


def _saved_row_blocks(fn, shape):
    """How many distinct float tensors of ``shape`` autograd saves while ``fn`` runs."""
    saved = {}

    def pack(tensor):
        if tuple(tensor.shape) == shape and tensor.is_floating_point():
            saved[tensor.untyped_storage().data_ptr()] = tensor
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        out = fn()
    return out, len(saved)


@pytest.mark.parametrize("focal_m", [None, 0.3])
def test_one_block_of_rows_keeps_at_most_two_buffers_for_its_backward(focal_m):
    """A chunk's logits save the similarity (Focal's backward needs it) and log-sum-exp's input, nothing else: the
    composed form (s + m, s (s + m), where(...), the scaled copy, the subtraction) kept two to three more."""
    torch.manual_seed(3)
    sim = (torch.rand(8, 64) * 2 - 1).requires_grad_()
    exclude = torch.zeros(8, 64, dtype=torch.bool)
    exclude[:, 40] = True
    penalty = torch.rand(8, 64)
    blocks = {"query_to_doc": fr.Block(sim * 1.0, has_positive=True, exclude=exclude, penalty=penalty)}
    rows, count = _saved_row_blocks(lambda: fr.ranking_rows(blocks, 20.0, "joint", focal_m), (8, 64))
    assert count <= (2 if focal_m is not None else 1)
    rows.sum().backward()  # and the in-place steps left autograd a consistent graph
    assert sim.grad is not None and torch.isfinite(sim.grad).all()
