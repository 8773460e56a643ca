"""One rule for unusable rows and impossible counts, the same in every loss: a row with no in-batch negative left is
counted, warned and left out (a batch of only such rows is refused) — AdCSE's adversaries alone do not make a row
usable; a count the other arguments or the batch cannot meet is clamped to what they allow, with a warning."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from st_hardneg import AdversarialNegativesLoss, HNCSELoss
from st_hardneg.losses.relevance import KnownPositives
from st_hardneg.testing import cosf
from st_hardneg.validation import clamp_count

TAU = 0.05


class SizedModel(torch.nn.Module):
    def __init__(self, dim: int = 6) -> None:
        super().__init__()
        self.dim = dim
        self.weight = torch.nn.Parameter(torch.zeros(1))

    def get_embedding_dimension(self) -> int:
        return self.dim


def columns(n=5, d=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    anchors = torch.randn(n, d, generator=g, dtype=torch.float64)
    return [anchors, anchors + 0.4 * torch.randn(n, d, generator=g, dtype=torch.float64)]


# ------------------------------------------------------------------------------------------------ AdCSE's rows
def test_adcse_refuses_a_batch_whose_in_batch_negatives_are_all_masked():
    """Before, the adversaries alone kept every row "usable" and AdCSE trained on them with a loss near 0 and no
    word; now the batch is refused like every loss's, naming the cause."""
    loss = AdversarialNegativesLoss(SizedModel(), num_adversaries=4, untied=False, seed=0, margin=3.0)
    with pytest.raises(ValueError, match=r"no usable row in this batch: 5 of 5 rows of a batch have no negative "
                                         r"left .*check margin"):
        loss.compute_loss_from_embeddings(columns(), None)
    assert loss.diagnostics["rows_without_negatives"] == 5.0
    assert loss.diagnostics["masked_fraction"] == 1.0  # the adversaries are not candidates: 4 of 4 masked per row


def test_adcse_leaves_out_a_row_with_only_adversaries_and_warns_once():
    """Anchor 1 knows every other positive as relevant, so row 1 keeps only its positive and the adversaries: it is
    left out, the others are exact (positive, 4 candidates, adversaries), and the warning is shown once."""
    cols = columns()
    n = 5
    keys = torch.tensor([[0, 1, 2, 3, 4], [10, 11, 12, 13, 14]])
    known = KnownPositives(torch.tensor([1] * 4), torch.tensor([10, 12, 13, 14]))
    loss = AdversarialNegativesLoss(SizedModel(), num_adversaries=3, untied=False, seed=0, adversary_lr=0.0,
                                    temperature=TAU, known_positives=known)
    loss.set_false_negative_inputs(text_keys=keys)
    with pytest.warns(UserWarning, match=r"1 of 5 rows of a batch have no negative left"):
        value = loss.compute_loss_from_embeddings(cols, None).item()
    adversaries = loss.adversaries.detach().double()
    rows = []
    for i in range(n):
        if i == 1:
            continue
        logits = [cosf(cols[0][i], cols[1][c]) / TAU for c in range(n)]
        logits += [cosf(cols[0][i], a) / TAU for a in adversaries]
        top = max(logits)
        rows.append(top + math.log(sum(math.exp(x - top) for x in logits)) - logits[i])
    assert value == pytest.approx(sum(rows) / len(rows), rel=1e-9)
    assert loss.diagnostics["rows_without_negatives"] == 1.0
    assert loss.diagnostics["unusable_fraction"] == pytest.approx(1 / 5)
    loss.set_false_negative_inputs(text_keys=keys)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # shown once
        loss.compute_loss_from_embeddings(cols, None)


# ------------------------------------------------------------------------------------------------ counts
def test_num_mixed_above_the_pairs_of_k_is_clamped_with_a_warning():
    """k=2, num_mixed=40 would put 40 copies of 2 mixtures in every denominator: clamped to k (k - 1) = 2, warned,
    and the loss is that of num_mixed=2 (the same seeded draws)."""
    cols = columns(n=6)
    with pytest.warns(UserWarning, match=r"HNCSELoss: num_mixed=40 but k=2 hard negatives make only 2 distinct "
                                         r"ordered pairs \(a, b\) to mix; using num_mixed=2"):
        clamped = HNCSELoss(None, mode="hnm", k=2, num_mixed=40, seed=3)
    assert clamped.num_mixed == 2 and clamped.get_config_dict()["num_mixed"] == 2
    exact = HNCSELoss(None, mode="hnm", k=2, num_mixed=2, seed=3)
    assert clamped.compute_loss_from_embeddings(cols, None).item() == exact.compute_loss_from_embeddings(cols,
                                                                                                         None).item()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        HNCSELoss(None, mode="hnm", k=10, num_mixed=40)  # the paper's 40 of 90 pairs: no warning
        HNCSELoss(None, mode="hnm", k=2, hnm_single=True, num_mixed=40)  # hnm_single mixes nothing


def test_a_small_batch_clamps_k_and_then_num_mixed_with_one_warning_each():
    cols = columns(n=4)  # 3 in-batch negatives per anchor
    loss = HNCSELoss(None, mode="hnm", k=5, num_mixed=20, seed=7)
    with pytest.warns(UserWarning) as caught:
        value = loss.compute_loss_from_embeddings(cols, None).item()
    messages = [str(w.message) for w in caught]
    assert any("k=5 but a batch of 4 pairs has only 3 in-batch negatives per anchor; using k=3" in m for m in messages)
    assert any("num_mixed=20 but this batch's k=3 hard negatives make only 6 distinct ordered pairs to mix; using "
               "num_mixed=6" in m for m in messages)
    exact = HNCSELoss(None, mode="hnm", k=3, num_mixed=6, seed=7)
    assert value == exact.compute_loss_from_embeddings(cols, None).item()
    assert loss.num_mixed == 20  # only this batch is clamped


def test_clamp_count_is_the_one_rule():
    assert clamp_count(3, "n", 5, "why", owner="X", remedy="do") == 3
    with pytest.warns(UserWarning, match=r"X: n=7 but why; using n=5\. do \(this warning is shown once\)\."):
        assert clamp_count(7, "n", 5, "why", owner="X", remedy="do") == 5
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert clamp_count(7, "n", 5, "why", owner="X", remedy="do", warn=False) == 5
