"""Loss-side memory. The ranking rows' logits are built in one buffer per block: Focal-InfoNCE's
transform keeps only the similarity for its backward, the later steps run in place, and none of it touches the
caller's similarity. HNCSE's positive mixing builds the mixtures of the mixed rows only."""

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


@pytest.mark.parametrize("weight_gradient", [False, True])
@pytest.mark.parametrize("detach_mix", [False, True])
def test_positive_mixing_mixes_only_the_mixed_rows_with_the_same_values_and_gradients(weight_gradient, detach_mix):
    """Against Eq. 2 written out for every row and a selection (the form that mixed every row): equal outputs and
    gradients, and the rows that keep their positive are exactly their positive."""
    from st_hardneg import functional as fn

    torch.manual_seed(4)
    anchors = torch.nn.functional.normalize(torch.randn(12, 5, dtype=torch.float64), dim=1).requires_grad_()
    positives = torch.nn.functional.normalize(torch.randn(12, 5, dtype=torch.float64), dim=1).requires_grad_()
    kwargs = dict(threshold=0.0, w1=0.8, w2=0.6, weight_gradient=weight_gradient, detach_mix=detach_mix,
                  assume_normalized=True)
    out = fn.positive_mixing(anchors, positives, **kwargs)
    assert 0 < int(out.mixed.sum()) < 12  # both kinds of rows are present
    # the reference: every row mixed, then selected
    a, p = anchors.detach().clone().requires_grad_(), positives.detach().clone().requires_grad_()
    weights = out.weights.detach() if not weight_gradient else fn.positive_mixing(a, p, **kwargs).weights
    every = weights.unsqueeze(1) * p + (1 - weights.unsqueeze(1)) * p[out.partners]
    every = every / every.norm(dim=1, keepdim=True)
    if detach_mix:
        every = every.detach()
    expected = torch.where(out.mixed.unsqueeze(1), every, p)
    torch.testing.assert_close(out.positives, expected, rtol=1e-12, atol=1e-12)
    assert torch.equal(out.positives[~out.mixed], positives[~out.mixed])
    upstream = torch.randn(12, 5, dtype=torch.float64)
    (out.positives * upstream).sum().backward()
    (expected * upstream).sum().backward()
    torch.testing.assert_close(positives.grad, p.grad, rtol=1e-10, atol=1e-12)
    if weight_gradient:
        torch.testing.assert_close(anchors.grad, a.grad, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("k", [2, 10, 128, 129, 16384, 16385])
def test_compact_pair_draws_are_the_int64_draws_in_the_narrowest_dtype(k):
    from st_hardneg import functional as fn

    dtype = fn.compact_index_dtype(k)
    assert dtype == (torch.uint8 if k <= 128 else torch.int16 if k <= 16384 else torch.int32)
    assert 2 * k - 2 <= torch.iinfo(dtype).max  # room for a + o before the modulo
    wide = fn.sample_distinct_pairs(7, k, 50, generator=torch.Generator().manual_seed(5))
    narrow = fn.sample_distinct_pairs(7, k, 50, generator=torch.Generator().manual_seed(5), dtype=dtype)
    for w, n in zip(wide, narrow, strict=True):
        assert w.dtype == torch.int64 and n.dtype == dtype and torch.equal(w, n.long())
    assert bool((narrow[0] != narrow[1]).all()) and int(narrow[1].long().max()) < k


def test_compact_pair_draws_refuse_a_dtype_without_room():
    from st_hardneg import functional as fn

    with pytest.raises(ValueError, match="cannot hold the sum of two positions < 129"):
        fn.sample_distinct_pairs(2, 129, 3, dtype=torch.uint8)
    with pytest.raises(ValueError, match="cannot hold"):
        fn.sample_distinct_pairs(2, 65, 3, dtype=torch.int8)  # 128 > 127
    fn.sample_distinct_pairs(2, 64, 3, dtype=torch.int8)  # 126 fits
    for bad in (torch.float32, torch.bool, "int16"):
        with pytest.raises(TypeError, match="integer torch.dtype"):
            fn.sample_distinct_pairs(2, 4, 3, dtype=bad)
    with pytest.raises(ValueError, match="k must be >= 1"):
        fn.compact_index_dtype(0)


def test_hncse_keeps_its_pair_draws_in_8_bits_for_the_batch():
    from st_hardneg.losses.hncse import HNCSELoss

    class Model(torch.nn.Module):
        def forward(self, features):
            return features

    loss = HNCSELoss(Model(), mode="hnm", k=5, num_mixed=6, seed=0)
    columns = [torch.nn.functional.normalize(torch.randn(9, 4, generator=torch.Generator().manual_seed(i)), dim=-1)
               for i in range(2)]
    seen = {}
    real_end = loss.end_batch

    def spy(batch):
        seen["draws"] = batch.state.draws["hnm_pairs"]
        real_end(batch)

    loss.end_batch = spy
    value = loss.compute_loss_from_embeddings(columns, None)
    first, second = seen["draws"]
    assert first.dtype == second.dtype == torch.uint8 and first.shape == (9, 6)
    assert bool((first != second).all()) and int(first.max()) < 5 and torch.isfinite(value)
