"""The loss side in chunks of anchor rows: with ``mini_batch_size`` every loss that implements
``window_rows`` computes its rows a chunk of anchors at a time against all candidates (``HardNegativeLoss.compute`` with a ``chunk_size``,
what GradCache calls), and that changes nothing: loss, gradients, diagnostics, warnings and errors equal the whole
batch's, for chunk sizes that do not divide the batch; and no tensor of the batch's N × N size is ever built.

Everything here runs in float64 on random embeddings (no model), so the comparisons are at 1e-9.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from st_hardneg import AdversarialNegativesLoss, FocalInfoNCELoss, HNCSELoss, MixCSELoss

N, D = 7, 6
TWO_WAY = {"directions": ("query_to_doc", "doc_to_query"), "partition_mode": "per_direction"}
ALL_DIRECTIONS = {"directions": ("query_to_doc", "query_to_query", "doc_to_query", "doc_to_doc")}


class Sized(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))

    def get_embedding_dimension(self) -> int:
        return D


#: id -> (factory, number of columns); every loss, its partner / pool / direction modes, masks and margins
CASES = {
    "focal": (lambda: FocalInfoNCELoss(None), 2),
    "focal-two-way": (lambda: FocalInfoNCELoss(None, **TWO_WAY), 3),
    "focal-all-directions-hardness": (
        lambda: FocalInfoNCELoss(None, **ALL_DIRECTIONS, hardness_mode="all_negatives", hardness_strength=3.0), 4),
    "focal-margin-relative": (lambda: FocalInfoNCELoss(None, margin=0.2, margin_strategy="relative"), 3),
    "focal-contrast-blocks": (lambda: FocalInfoNCELoss(None, margin=0.3, contrast_anchors=True,
                                                       contrast_positives=True), 3),
    "mixcse-shift": (lambda: MixCSELoss(None), 2),
    "mixcse-shift-two-way-margin": (lambda: MixCSELoss(None, **TWO_WAY, margin=0.3), 3),
    "mixcse-random": (lambda: MixCSELoss(None, partner="random", seed=3, **TWO_WAY), 2),
    "mixcse-hardest-focal": (lambda: MixCSELoss(None, partner="hardest", focal_m=0.3, margin=0.3), 3),
    "mixcse-explicit": (lambda: MixCSELoss(None, partner="explicit", **TWO_WAY), 3),
    "mixcse-dot": (lambda: MixCSELoss(None, similarity_fct="dot_score", scale=1.0), 3),
    "hncse-pm": (lambda: HNCSELoss(None, mode="pm", pm_threshold=0.5), 2),
    "hncse-both-margin": (lambda: HNCSELoss(None, mode="both", k=3, num_mixed=4, seed=1, margin=0.3,
                                            pm_gradient=True, pm_weight_gradient=True), 3),
    "hncse-hnm-all-pool": (lambda: HNCSELoss(None, mode="hnm", k=4, num_mixed=3, seed=2,
                                             hnm_pool="all_negatives", alpha="adaptive"), 3),
    "hncse-hnm-single-hard-pool": (lambda: HNCSELoss(None, mode="hnm", hnm_single=True, k=1,
                                                     hnm_pool="hard_negatives"), 3),
    "adcse": (lambda: AdversarialNegativesLoss(Sized(), num_adversaries=4, untied=False, seed=0), 3),
    "adcse-own-keys": (lambda: AdversarialNegativesLoss(Sized(), num_adversaries=3, untied=False, seed=0,
                                                        in_batch_keys=False), 3),
    "mnrl-reduction": (lambda: AdversarialNegativesLoss(Sized(), num_adversaries=0, untied=False,
                                                        mask_duplicates=False, **ALL_DIRECTIONS), 3),
}


def columns(num: int, n: int = N, seed: int = 0) -> list[torch.Tensor]:
    """Pairs whose positives are near their anchors, and one planted duplicate (positive 5 = positive 2), so that
    the false-negative mask has something to do."""
    g = torch.Generator().manual_seed(seed)
    anchors = torch.randn(n, D, generator=g, dtype=torch.float64)
    cols = [anchors, anchors + 0.6 * torch.randn(n, D, generator=g, dtype=torch.float64)]
    cols += [torch.randn(n, D, generator=g, dtype=torch.float64) for _ in range(num - 2)]
    cols[1][5] = cols[1][2]
    return cols


def whole(loss, cols):
    leaves = [c.clone().requires_grad_(True) for c in cols]
    value = loss.compute_loss_from_embeddings(leaves, None)
    value.backward()
    return value.detach(), [leaf.grad for leaf in leaves], loss.diagnostics


def chunked(loss, cols, chunk):
    leaves = [c.clone().requires_grad_(True) for c in cols]
    loss.mini_batch_size = chunk  # the functional path: no model to embed with, only the loss side is chunked
    windows = []
    inner = loss.window_rows
    loss.window_rows = lambda batch: windows.append(batch.row_range) or inner(batch)
    value = loss.compute(leaves, None, chunk_size=loss.loss_chunk_size, with_backward=True)
    return value, [leaf.grad for leaf in leaves], loss.diagnostics, windows


@pytest.mark.parametrize("chunk", [1, 3, N, 64])
@pytest.mark.parametrize("case", list(CASES))
def test_chunked_rows_equal_the_whole_batch(case, chunk):
    factory, num = CASES[case]
    cols = columns(num)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # masked rows may warn; the warning itself is tested below
        value, grads, diagnostics = whole(factory(), cols)
        loss = factory()
        assert loss.supports_row_chunks
        got, got_grads, got_diagnostics, windows = chunked(loss, cols, chunk)
    starts = list(range(0, N, chunk))
    assert windows == [(s, min(s + chunk, N)) for s in starts]  # the rows, a chunk at a time, each once
    assert got.item() == pytest.approx(value.item(), rel=1e-10)
    for a, b in zip(got_grads, grads, strict=True):
        if b is None:
            assert a is None or float(a.abs().max()) == 0.0
        else:
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)
    assert got_diagnostics.keys() == diagnostics.keys()
    for key, expected in diagnostics.items():  # the masked counts are float32 means (rounding 1e-7)
        assert got_diagnostics[key] == pytest.approx(expected, rel=1e-6, abs=1e-12), key


def test_the_adversaries_get_the_whole_batch_gradient_once():
    """AdCSE in chunks: one ascent window entry per batch (not per chunk), equal to the whole batch's gradient."""
    cols = columns(3)
    whole_loss = AdversarialNegativesLoss(Sized(), num_adversaries=4, untied=False, seed=0)
    chunked_loss = AdversarialNegativesLoss(Sized(), num_adversaries=4, untied=False, seed=0)
    whole(whole_loss, cols)
    chunked(chunked_loss, cols, 3)
    for loss in (whole_loss, chunked_loss):
        assert loss.adversary_bank.pending_micro_batches == 1
    # the ascent gradient is float32 (the bank's own precision): chunk sums agree to float32 rounding
    torch.testing.assert_close(chunked_loss.adversary_bank._grad_sum, whole_loss.adversary_bank._grad_sum,
                               rtol=1e-5, atol=1e-7)


def test_rows_without_negatives_are_judged_on_the_whole_batch():
    """A chunk whose rows all lost their negatives does not raise by itself: the rule (the unusable-row rule) applies to the
    batch, with the same warning, counts and mean as the whole batch."""
    cols = columns(2)
    cols[1][0] = -cols[0][0]  # margin 0: row 0 keeps no negative (its positive is its farthest candidate)
    with pytest.warns(UserWarning, match=r"rows of a batch have no negative left"):
        value, _, diagnostics = whole(FocalInfoNCELoss(None, margin=0.0), cols)
    with pytest.warns(UserWarning, match=r"rows of a batch have no negative left"):
        got, _, got_diagnostics, _ = chunked(FocalInfoNCELoss(None, margin=0.0), cols, 1)
    assert diagnostics["rows_without_negatives"] >= 1
    assert got.item() == pytest.approx(value.item(), rel=1e-10)
    assert got_diagnostics["rows_without_negatives"] == diagnostics["rows_without_negatives"]


def test_a_batch_without_any_usable_row_is_still_an_error_in_chunks():
    cols = columns(2)
    with pytest.raises(ValueError, match=r"no usable row in this batch: 7 of 7 rows of a batch have no negative left"):
        chunked(FocalInfoNCELoss(None, margin=3.0), cols, 2)


def test_the_official_mixcse_layout_is_computed_whole():
    """Its N×3N cross-entropy is not chunked (documented): GradCache computes it with compute_loss_from_embeddings."""
    assert not MixCSELoss(None, layout="official").supports_row_chunks
    assert MixCSELoss(None).supports_row_chunks


class LargestTensor(TorchDispatchMode):
    """Records the largest number of elements of any tensor an operation produces."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in out if isinstance(out, tuple | list) else (out,):
            if isinstance(tensor, torch.Tensor):
                self.largest = max(self.largest, tensor.numel())
        return out


@pytest.mark.parametrize("case", ["focal-all-directions-hardness", "focal-contrast-blocks", "mixcse-shift-two-way-margin",
                                  "mixcse-hardest-focal", "hncse-both-margin", "hncse-hnm-all-pool", "adcse",
                                  "mnrl-reduction"])
def test_no_tensor_of_the_batch_squared_size_is_built(case):
    """N = 512 pairs of width 6, chunks of 8 rows: the largest tensor of the chunked loss, forward and backward, is
    a chunk's rows against the candidates of its blocks (at most 8 × 2·N·columns with all four directions joined),
    far below N × N = 262,144 elements; the whole batch's builds them."""
    factory, num = CASES[case]
    n = 512
    cols = columns(num, n=n)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        whole_mode = LargestTensor()
        with whole_mode:
            whole(factory(), cols)
        chunk_mode = LargestTensor()
        loss = factory()
        with chunk_mode:
            chunked(loss, cols, 8)
    assert whole_mode.largest >= n * n
    assert chunk_mode.largest <= 8 * n * 2 * num <= n * n / 4
