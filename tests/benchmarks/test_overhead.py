"""benchmarks.overhead: its summary of the interleaved times, its records file, the committed table, and the HNCSE
speed-up it measured (the fast synthetic cosines equal the explicit mixtures). The study spec and its smoke run:
``tests/studies/test_measure_overhead.py``."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def _load():
    return importlib.import_module("benchmarks.overhead")


def test_summarize_ratios_are_per_round_medians_against_mnrl():
    """Each round's ratio t(method) / t(mnrl) in that round, their median and quartiles; the ratio of medians; the
    medians in ms; the loss share of a step; the target and whether it is met."""
    import statistics

    mnrl = [1.0, 2.0, 1.0, 4.0]
    adcse = [1.5, 2.0, 3.0, 4.4]  # per round: 1.5, 1.0, 3.0, 1.1
    rows = _load().summarize({"mnrl": mnrl, "adcse": adcse}, {"mnrl": [0.001, 0.003], "adcse": [0.002]})
    ratios = [1.5, 1.0, 3.0, 1.1]
    q = statistics.quantiles(ratios, n=4)
    assert rows["adcse"]["step_ratio_vs_mnrl"] == round(statistics.median(ratios), 4) == 1.3
    assert rows["adcse"]["step_ratio_iqr"] == [round(q[0], 4), round(q[2], 4)]
    assert rows["adcse"]["step_ratio_of_medians"] == round(2.5 / 1.5, 4)
    assert rows["adcse"]["step_ms"] == 2500.0 and rows["adcse"]["loss_only_ms"] == 2.0
    assert rows["adcse"]["loss_only_share_of_step"] == round(2.0 / 2500.0, 5)
    assert rows["adcse"]["target"] == 1.45 and rows["adcse"]["meets_target"] is True
    assert rows["mnrl"]["step_ratio_vs_mnrl"] == 1.0 and rows["mnrl"]["step_ratio_iqr"] == [1.0, 1.0]
    assert "target" not in rows["mnrl"] and rows["mnrl"]["steps_measured"] == 4


def test_the_records_file_is_one_record_and_bad_settings_are_refused():
    overhead = _load()
    data = json.loads((RESULTS / "overhead.json").read_text())
    records, meta = overhead.read(data)
    assert records == [data] and meta == {"group": "interleaved", "seed": 0}
    assert overhead.layout(records, meta) == data
    stamped = {**data, "_meta": {**data["_meta"], "commit": "abc", "group": "g", "seed": 3}}
    records, meta = overhead.read(stamped)
    assert records[0]["commit"] == "abc" and meta == {"group": "g", "seed": 3}  # where the runner reads them
    assert overhead.layout(records, meta) == stamped
    with pytest.raises(ValueError, match="one measurement"):
        overhead.layout([data, data], {})
    from st_hardneg.training.studies.spec import Row

    assert overhead.group_methods(Row(loss="mnrl", extra={"methods": ["adcse", "mnrl"]})) == ["mnrl", "adcse"]
    with pytest.raises(ValueError, match="unknown method"):
        overhead.group_methods(Row(loss="mnrl", extra={"methods": ["nope"]}))

    class Spec:
        protocol = {"steps": 25}

    assert overhead.settings(Spec(), {"steps": 3})["steps"] == 3
    for bad in ({"steps": 0}, {"warmup": -1}, {"lr": "fast"}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            overhead.settings(Spec(), bad)


@pytest.mark.parametrize("alpha", [0.5, 0.3, "adaptive"])
@pytest.mark.parametrize("hnm_gradient", [True, False])
def test_hncse_fast_synthetic_cosines_match_the_mixtures(alpha, hnm_gradient):
    """The overhead fix: HNCSE's loss scores its synthetic negatives from the cosine and Gram matrices
    (functional.mixed_negative_cosines) instead of building the (N, m, d) mixtures; values and gradients must equal
    those of the explicit mixtures (functional.hard_negative_mixing) with the same random draws."""
    import torch

    from st_hardneg import HNCSELoss
    from st_hardneg import functional as fn
    from st_hardneg.testing.fixtures import hncse_synthetic_cosines, hncse_synthetic_negatives

    torch.manual_seed(0)
    h = torch.randn(64, 48, dtype=torch.float32)
    hp = (h + 0.3 * torch.randn(64, 48)).requires_grad_(True)
    h.requires_grad_(True)
    loss = HNCSELoss(None, mode="hnm", alpha=alpha, hnm_gradient=hnm_gradient, seed=7)
    fast = hncse_synthetic_cosines(loss, h, hp)
    (fast * torch.linspace(-1, 1, fast.numel()).view_as(fast)).sum().backward()
    def grads():
        return [torch.zeros_like(t) if t.grad is None else t.grad.clone() for t in (h, hp)]

    fast_grads = grads()
    h.grad = hp.grad = None
    reference = HNCSELoss(None, mode="hnm", alpha=alpha, hnm_gradient=hnm_gradient, seed=7)
    explicit = torch.einsum("nd,nsd->ns", fn.normalize(h), hncse_synthetic_negatives(reference, h, hp))
    (explicit * torch.linspace(-1, 1, explicit.numel()).view_as(explicit)).sum().backward()
    torch.testing.assert_close(fast, explicit, rtol=1e-5, atol=1e-5)
    explicit_grads = grads()
    torch.testing.assert_close(fast_grads[0], explicit_grads[0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(fast_grads[1], explicit_grads[1], rtol=1e-4, atol=1e-5)
    assert fast_grads[1].abs().sum() > 0 if hnm_gradient else fast_grads[1].abs().sum() == 0
    # a zero vector in the pool: its mixtures keep a finite cosine and gradient, as with F.normalize
    zero = hp.detach().clone()
    zero[3] = 0
    zero.requires_grad_(True)
    out = fn.mixed_negative_cosines(h.detach(), zero, torch.tensor([[3, 3]]), torch.tensor([[3, 5]]), alpha=0.5)
    out.sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(zero.grad).all() and out[0, 0] == 0


def test_committed_table_is_rendered_from_its_json():
    """The report code (one markdown-table helper for all) renders the committed results exactly as committed."""
    data = json.loads((RESULTS / "overhead.json").read_text())
    assert _load().markdown(data) == (RESULTS / "overhead.md").read_text()
