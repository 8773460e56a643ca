"""The one compute template of every loss (``HardNegativeLoss.compute_loss_from_embeddings``): the papers supply
their rows only; per-batch state prepared by ``begin_batch`` is dropped by ``close_batch`` also when a batch raised,
and committed (``end_batch``) only when it did not."""

from __future__ import annotations

import pytest
import torch

from st_hardneg import AdversarialNegativesLoss, FocalInfoNCELoss, HNCSELoss, MixCSELoss
from st_hardneg.losses.base import HardNegativeLoss


class SizedModel(torch.nn.Module):
    def __init__(self, dim: int = 6) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))

    def get_embedding_dimension(self) -> int:
        return 6


def columns(n=6, d=6, seed=0, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    anchors = torch.randn(n, d, generator=g)
    cols = [anchors, anchors + 0.4 * torch.randn(n, d, generator=g)]
    return [c.requires_grad_(requires_grad) for c in cols]


def test_the_papers_supply_columns_and_the_template_is_written_once():
    """A paper gives its columns (or, Focal-InfoNCE, its logit rule); the per-window step that turns blocks into
    rows, the template, is the base's alone."""
    for cls in (MixCSELoss, FocalInfoNCELoss, HNCSELoss, AdversarialNegativesLoss):
        assert "compute_loss_from_embeddings" not in vars(cls)
        assert "forward" not in vars(cls)  # AdCSE gives an embed() hook instead
        assert "window_rows" not in vars(cls) and "compute" not in vars(cls)
        assert "paper_columns" in vars(cls) or "logit_margin" in vars(cls)
    assert "embed" in vars(AdversarialNegativesLoss) and "before_embedding" in vars(AdversarialNegativesLoss)


class Boom(RuntimeError):
    pass


def _raise_in_rows(loss, monkeypatch):
    def rows(batch):
        raise Boom("a row failed")

    monkeypatch.setattr(loss, "window_rows", rows)


@pytest.mark.parametrize("chunked", [False, True])
def test_a_batch_that_raises_leaves_no_per_batch_state(monkeypatch, chunked):
    mix = MixCSELoss(None, partner="random", seed=0)
    hn = HNCSELoss(None, mode="hnm", k=3, num_mixed=4, seed=0)
    for loss, attribute, draw in ((mix, "_proposed", "partners"), (hn, "_hnm_draws", "hnm_pairs")):
        seen = {}
        real_begin = loss.begin_batch

        def begin(batch, real_begin=real_begin, draw=draw, seen=seen):
            out = real_begin(batch)
            seen["prepared"] = out.state.draws.get(draw) is not None  # the draws live on the batch
            return out

        monkeypatch.setattr(loss, "begin_batch", begin)
        _raise_in_rows(loss, monkeypatch)
        with pytest.raises(Boom):
            if chunked:
                loss.compute(columns(), None, chunk_size=loss.loss_chunk_size)
            else:
                loss.compute_loss_from_embeddings(columns(), None)
        assert seen["prepared"] and getattr(loss, attribute, None) is None


def test_adcse_commits_its_adversary_gradient_only_for_a_batch_that_did_not_raise(monkeypatch):
    loss = AdversarialNegativesLoss(SizedModel(), num_adversaries=3, untied=False, seed=0)
    bank = loss.adversary_bank
    loss.compute_loss_from_embeddings(columns(requires_grad=True), None).backward()
    assert bank.pending_micro_batches == 1
    before = bank._grad_sum.clone()
    loss.model.weight.grad = torch.zeros(1)  # gradient accumulation: the window stays open for the next batch
    _raise_in_rows(loss, monkeypatch)
    with pytest.raises(Boom):
        loss.compute_loss_from_embeddings(columns(requires_grad=True), None)
    assert bank.pending_micro_batches == 1 and torch.equal(bank._grad_sum, before)
    assert getattr(loss, "_adversary_rows", None) is None


def test_whole_batch_rows_is_refused_for_a_loss_that_computes_windows():
    with pytest.raises(NotImplementedError, match="window_rows"):
        HardNegativeLoss.whole_batch_rows(FocalInfoNCELoss(None), None)
