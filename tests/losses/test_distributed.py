"""gather_across_devices is exact: 2 gloo processes, each with half of the batch, reproduce the single-process loss.

Each spawn test runs ``torch.multiprocessing.spawn`` with 2 CPU processes, the gloo backend and a ``file://``
rendezvous in ``tmp_path`` (harness: st_hardneg.testing.distributed). The equations checked, for ``W = 2`` processes
each holding ``n = N / W`` rows and computing the mean loss ``L_r`` of its own anchors:

    mean_r L_r = L                                  (L: single-process loss on all N rows)
    grad_r(x_r) = sum_r' dL_r'/dx_r = W * dL/dx_r    (backward of all_gather_with_grad sums over processes)
    => concat_r grad_r / W = dL/dx                  (and DDP's average of parameter gradients = dL/dtheta)

All 2-process runs of this module share one spawn (a module-scoped fixture): starting the processes (importing
torch and sentence-transformers twice) is most of the cost.

The harness is validated on sentence-transformers' MultipleNegativesRankingLoss(gather_across_devices=True), on a
gathered InfoNCE written here, and on a loss drawing a random partner identically on every process; with the gather
(or the shared random draw) removed, the same comparison fails, as the ``*_detects_*`` tests show.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from sentence_transformers.sentence_transformer.losses import (
    CachedMultipleNegativesRankingLoss,
    MultipleNegativesRankingLoss,
)
from torch import nn

from st_hardneg.losses import distributed as D
from st_hardneg.losses.gradcache import GradCached
from st_hardneg.testing.distributed import compare, gathered_loss_job, model_step, spawn_jobs

TAU = 0.05
N, DIM = 8, 6


def embeddings(num_columns: int = 2, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(N, DIM, generator=g, dtype=torch.float64) for _ in range(num_columns)]


class GatheredInfoNCE(nn.Module):
    """InfoNCE of local anchors against the candidates of every process (positives, then negative columns)."""

    def __init__(self, gather: bool = True):
        super().__init__()
        self.gather = gather

    def compute_loss_from_embeddings(self, embeddings, labels):
        anchors = F.normalize(embeddings[0], dim=-1)
        columns = [F.normalize(e, dim=-1) for e in embeddings[1:]]
        if self.gather:
            columns = [D.gather_with_grad(c) for c in columns]
        own = D.local_rows(anchors.size(0)) if self.gather else slice(0, anchors.size(0))
        logits = anchors @ torch.cat(columns).T / TAU
        return F.cross_entropy(logits, torch.arange(own.start, own.stop))


class RandomPartnerInfoNCE(nn.Module):
    """InfoNCE with one extra negative per anchor: the positive of a random other row of the gathered batch, drawn
    from a generator seeded identically on every process (``shared=True``) or from each process's own RNG."""

    def __init__(self, shared: bool = True):
        super().__init__()
        self.shared = shared

    def compute_loss_from_embeddings(self, embeddings, labels):
        anchors = F.normalize(embeddings[0], dim=-1)
        positives = D.gather_with_grad(F.normalize(embeddings[1], dim=-1))
        total, own = positives.size(0), D.local_rows(anchors.size(0))
        seed = D.shared_seed() if self.shared else int(torch.randint(0, 2**62, (1,)))
        g = torch.Generator().manual_seed(seed)
        shift = torch.randint(1, total, (total,), generator=g)  # partner of global row i: (i + shift_i) mod total
        partner = (torch.arange(total) + shift) % total
        extra = (anchors * positives[partner[own]]).sum(-1, keepdim=True)
        logits = torch.cat([anchors @ positives.T, extra], dim=1) / TAU
        return F.cross_entropy(logits, torch.arange(own.start, own.stop))


def make_mnrl():
    return MultipleNegativesRankingLoss(None, gather_across_devices=True)


def make_mnrl_local():
    return MultipleNegativesRankingLoss(None, gather_across_devices=False)


def make_infonce():
    return GatheredInfoNCE(gather=True)


def make_infonce_local():
    return GatheredInfoNCE(gather=False)


def make_partner_shared():
    return RandomPartnerInfoNCE(shared=True)


def make_partner_local():
    return RandomPartnerInfoNCE(shared=False)


def assert_exact(result, tol=1e-5):
    world_size = result["world_size"]
    assert result["distributed_loss_mean"] == pytest.approx(result["single_loss"], abs=tol)
    for dist_grad, single_grad in zip(result["distributed_grads"], result["single_grads"], strict=True):
        assert single_grad.abs().max() > 1e-3  # every column receives a gradient
        torch.testing.assert_close(dist_grad / world_size, single_grad, rtol=tol, atol=tol * 1e-2)


def test_identity_without_process_group():
    x = torch.randn(3, 2, requires_grad=True)
    assert not D.is_distributed() and D.rank() == 0 and D.world_size() == 1
    assert D.gather_with_grad(x) is x
    assert torch.equal(D.gather(x), x) and not D.gather(x).requires_grad
    assert D.broadcast_from_rank0(x) is x
    assert D.local_rows(3) == slice(0, 3)
    D.check_equal_local_batches(5)  # a no-op
    with pytest.raises(ValueError, match="n_local"):
        D.local_rows(-1)


def test_infonce_single_process_matches_hand_equation():
    embs = embeddings(3)
    loss = GatheredInfoNCE().compute_loss_from_embeddings(embs, None)
    a = [r / r.norm() for r in embs[0]]
    c = [r / r.norm() for col in embs[1:] for r in col]
    hand = 0.0
    for i, ai in enumerate(a):
        scores = [float(ai @ cj) / TAU for cj in c]
        hand += -(scores[i] - math.log(sum(math.exp(s) for s in scores)))
    assert loss.item() == pytest.approx(hand / N, rel=1e-10)


def _collectives(rank, world_size):
    x = torch.full((2, 3), float(rank), dtype=torch.float64, requires_grad=True)
    gathered = D.gather_with_grad(x)
    # d/dx_r of sum_r' (r' + 1) * sum(gathered): every process's loss weighs the gathered rows by its own factor
    ((rank + 1) * gathered.sum()).backward()
    seeds = [D.shared_seed() for _ in range(2)]
    torch.manual_seed(100 + rank)
    ragged = None
    try:
        D.check_equal_local_batches(4 + rank)
    except ValueError as exc:
        ragged = str(exc)
    return {"gathered": gathered.detach(), "grad": x.grad, "plain": D.gather(x), "rows": D.local_rows(2),
            "bcast": D.broadcast_from_rank0(torch.tensor([rank + 7])), "seeds": seeds, "ragged": ragged,
            "world": (D.is_distributed(), D.rank(), D.world_size())}


def make_cached_mnrl(model):
    return GradCached(MultipleNegativesRankingLoss(model, gather_across_devices=True), mini_batch_size=2)


def make_cached_mnrl_local(model):
    return GradCached(MultipleNegativesRankingLoss(model, gather_across_devices=False), mini_batch_size=2)


def make_uncached_mnrl(model):
    return MultipleNegativesRankingLoss(model)


def make_st_cached_mnrl(model):
    return CachedMultipleNegativesRankingLoss(model, mini_batch_size=2, gather_across_devices=True)


#: (name, loss factory, number of columns) of the embedding-level comparisons
EXACT_CASES = [("mnrl-2", make_mnrl, 2), ("mnrl-3", make_mnrl, 3), ("infonce-3", make_infonce, 3),
               ("partner-shared", make_partner_shared, 2)]
BROKEN_CASES = [("mnrl-local", make_mnrl_local, 2), ("infonce-local", make_infonce_local, 2),
                ("partner-local", make_partner_local, 2)]
MODEL_CASES = [("gradcached-mnrl", make_cached_mnrl), ("st-cached-mnrl", make_st_cached_mnrl),
               ("gradcached-mnrl-local", make_cached_mnrl_local)]
TEXT_COLUMNS = [
    ["a man plays the guitar.", "a woman plays the piano.", "the dog runs in the park.", "the cat eats food.",
     "children read a book.", "the sky is blue.", "people walk to the station.", "one car drives on the road."],
    ["the sun is hot.", "rain in the city at night.", "two children eat bread.", "a train at the station.",
     "the house is red.", "she writes a letter.", "snow is cold.", "three apples and water."],
]


@pytest.fixture(scope="module")
def spawned(tmp_path_factory, tiny_model_dir):
    """Every 2-process job of this module, run in one spawn: {name: [rank 0 result, rank 1 result]}."""
    names, jobs = ["collectives"], [(_collectives, ())]
    for name, make_loss, num_columns in EXACT_CASES + BROKEN_CASES:
        names.append(name)
        jobs.append(gathered_loss_job(make_loss, embeddings(num_columns)))
    for name, make_loss in MODEL_CASES:
        names.append(name)
        jobs.append((model_step, (make_loss, str(tiny_model_dir), TEXT_COLUMNS)))
    results = spawn_jobs(jobs, tmp_path_factory.mktemp("spawn"))
    return dict(zip(names, results, strict=True))


def test_collectives_in_two_processes(spawned):
    r0, r1 = spawned["collectives"]
    expected = torch.tensor([[0.0] * 3] * 2 + [[1.0] * 3] * 2, dtype=torch.float64)
    for rank, r in enumerate((r0, r1)):
        assert torch.equal(r["gathered"], expected) and torch.equal(r["plain"], expected)
        assert r["world"] == (True, rank, 2)
        assert r["rows"] == slice(2 * rank, 2 * rank + 2)
        assert r["bcast"].item() == 7  # rank 0's value everywhere
        # the gradient reaching x_r sums both processes' weights: 1 + 2 = 3 (the reduce-scatter of the gather)
        assert torch.equal(r["grad"], torch.full((2, 3), 3.0, dtype=torch.float64))
        assert "same local batch size" in r["ragged"]
    assert r0["seeds"] == r1["seeds"] and r0["seeds"][0] != r0["seeds"][1]


@pytest.mark.parametrize("name,make_loss,num_columns", EXACT_CASES, ids=[c[0] for c in EXACT_CASES])
def test_gathered_loss_is_exact(spawned, name, make_loss, num_columns):
    assert_exact(compare(make_loss, embeddings(num_columns), None, spawned[name]))


@pytest.mark.parametrize("name,make_loss,num_columns", BROKEN_CASES, ids=[c[0] for c in BROKEN_CASES])
def test_harness_detects_missing_gather_or_unshared_draw(spawned, name, make_loss, num_columns):
    result = compare(make_loss, embeddings(num_columns), None, spawned[name])
    with pytest.raises(AssertionError):
        assert_exact(result)


@pytest.mark.parametrize("name", ["gradcached-mnrl", "st-cached-mnrl"])
def test_gradcache_composes_with_gather(spawned, tiny_model_dir, name):
    """2 processes x (GradCache with mini-batches of 2 + gather) = 1 process, uncached, on the whole batch:
    same loss and same (DDP-averaged) parameter gradients (float64 model, dropout off)."""
    single_loss, single_grads = model_step(0, 1, make_uncached_mnrl, str(tiny_model_dir), TEXT_COLUMNS)
    results = spawned[name]
    assert sum(loss for loss, _ in results) / 2 == pytest.approx(single_loss, rel=1e-8)
    compared = 0
    for param, g in single_grads.items():
        for _, grads in results:
            if g is None:
                assert grads[param] is None
            elif g.norm() > 1e-12:  # a few position / token-type rows get ~1e-22 (round-off only)
                assert (grads[param] - g).norm() <= 1e-8 * g.norm(), param
                compared += 1
    assert compared > 20


def test_gradcache_without_gather_is_detected(spawned, tiny_model_dir):
    """The model-level check can fail: the same cached loss without the gather misses the other process's
    candidates, so neither the loss nor the gradients match the whole batch."""
    single_loss, single_grads = model_step(0, 1, make_uncached_mnrl, str(tiny_model_dir), TEXT_COLUMNS)
    results = spawned["gradcached-mnrl-local"]
    assert abs(sum(loss for loss, _ in results) / 2 - single_loss) > 1e-3
    weight = "0.model.encoder.layer.0.attention.self.query.weight"
    assert (results[0][1][weight] - single_grads[weight]).norm() > 1e-3 * single_grads[weight].norm()
