"""benchmarks.overhead: the smoke run, the committed table, and the HNCSE speed-up it measured (the fast synthetic
cosines equal the explicit mixtures)."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def _load():
    return importlib.import_module("benchmarks.overhead")


def test_overhead_smoke(tiny_model_dir, shared_data, tmp_path):
    overhead = _load()
    out = tmp_path / "overhead.json"
    code = overhead.main(["--steps", "3", "--warmup", "1", "--loss-reps", "3", "--model", str(tiny_model_dir),
                          "--methods", "mixcse", "adcse", "--corpus", str(shared_data / "corpus" / "wiki10k.txt"),
                          "--out", str(out), "--quiet"])
    assert code == 0
    results = json.loads(out.read_text())
    assert set(results) == {"mnrl", "mixcse", "adcse", "_meta"}
    assert results["mnrl"]["step_ratio_vs_mnrl"] == 1.0
    for name in ("mnrl", "mixcse", "adcse"):
        row = results[name]
        assert row["step_ms"] > 0 and row["loss_only_ms"] > 0 and row["steps_measured"] == 3
    assert results["adcse"]["target"] == 1.45 and isinstance(results["adcse"]["meets_target"], bool)
    assert results["_meta"]["smoke"] is True and results["_meta"]["embedding_dim"] == 32
    assert "| adcse |" in out.with_suffix(".md").read_text()


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
