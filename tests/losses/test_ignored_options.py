"""An option the configuration would ignore is refused, not taken without a word."""

from __future__ import annotations

import pytest

from st_hardneg import FocalInfoNCELoss, HNCSELoss


def test_queue_momentum_with_an_online_queue_is_refused(tiny_model):
    with pytest.raises(ValueError, match=r"queue_momentum=0.9 with queue_source='online': an online queue has no key "
                                         r"encoder to move"):
        FocalInfoNCELoss(tiny_model, queue_size=8, queue_momentum=0.9)
    assert FocalInfoNCELoss(tiny_model, queue_size=8).options.queue.momentum == 0.995  # the default is not "given"


@pytest.mark.parametrize("pool", ["hard_negatives", "all_negatives"])
def test_hnm_pool_without_hnm_is_refused(pool):
    with pytest.raises(ValueError, match=rf"hnm_pool='{pool}' is where HNM mines, and mode='pm' runs no HNM"):
        HNCSELoss(None, mode="pm", hnm_pool=pool)
    assert HNCSELoss(None, mode="both", hnm_pool=pool).hnm_pool == pool
