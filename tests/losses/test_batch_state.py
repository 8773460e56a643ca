"""A batch leaves the loss as it found it, except the one stats record (``_last_stats``): the paper's draws, the
false-negative counts and the queue's counts live on the batch (``batch.state``), cross-batch state inside the part
that owns it (the queue's rows inside the queue, AdCSE's adversary window in its bank, the forward counts in each
stateful part's step clock)."""

from __future__ import annotations

import pytest
import torch

from st_hardneg import AdversarialNegativesLoss, FocalInfoNCELoss, HNCSELoss, MixCSELoss


class Linear(torch.nn.Module):
    """A model whose output is a linear map of its input (enough for a training forward and an optimizer step)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.eye(6) + 0.1 * torch.randn(6, 6, generator=torch.Generator().manual_seed(0)))

    def forward(self, features):
        return {"sentence_embedding": features["x"] @ self.weight}

    def get_embedding_dimension(self) -> int:
        return 6


def _features(seed: int) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    anchors = torch.randn(8, 6, generator=g)
    return [{"x": anchors}, {"x": anchors + 0.3 * torch.randn(8, 6, generator=g)}]


def _rebound(before: dict[str, object], after: dict[str, object]) -> list[str]:
    """The attributes bound to another object (or, for numbers, another value) in ``after`` than in ``before``
    (``before`` keeps its objects alive, so an identity is never reused)."""
    def same(a: object, b: object) -> bool:
        return a == b if isinstance(a, int | float | bool | str) else a is b

    return sorted(name for name in {*before, *after} if name not in before or name not in after
                  or not same(before[name], after[name]))


@pytest.mark.parametrize("make_loss", [
    lambda m: MixCSELoss(m, seed=0, partner="random", queue_size=16),
    lambda m: MixCSELoss(m, seed=0, partner="random", queue_size=16, mini_batch_size=3),
    lambda m: FocalInfoNCELoss(m, seed=0, queue_size=16, margin=0.9),
    lambda m: HNCSELoss(m, seed=0, mode="both", k=3, num_mixed=4, queue_size=16),
    lambda m: AdversarialNegativesLoss(m, seed=0, num_adversaries=4, queue_size=16),
    lambda m: AdversarialNegativesLoss(m, seed=0, num_adversaries=4, untied=False, queue_size=16, mini_batch_size=3),
], ids=["mixcse", "mixcse-gradcache", "focal-margin", "hncse-both", "adcse", "adcse-tied-gradcache"])
def test_a_training_batch_rebinds_only_the_stats_record(make_loss):
    model = Linear()
    loss = make_loss(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for seed in range(2):  # warm-up: the generator and the queue's rows exist, the queue is read
        loss(_features(seed), None).backward()
        optimizer.step()
        optimizer.zero_grad()
    assert loss.queue is not None and loss.queue.filled == 16
    before = dict(vars(loss))
    loss(_features(2), None).backward()
    assert _rebound(before, dict(vars(loss))) == ["_last_stats"]
    assert "queue_rows_read" in loss.diagnostics  # the queue was read by the batch
