"""gather_across_devices and mini_batch_size are exact for every st-hardneg loss and mode.

Two acceptance criteria, each checked against a reference computed independently of the feature under test:

1. **Gather** (2 CPU processes, gloo, one spawn for the whole module): each process holds half of the batch and
   computes the loss with ``gather_across_devices=True``. With ``W = 2`` and ``L`` the single-process loss of the
   whole batch::

       mean_r L_r = L                       and      concat_r(dL_r/dx_r) / W = dL/dx

   (the gather's backward sums every process's gradient; see ``st_hardneg.losses.distributed``), for every column's
   embeddings, to 1e-5. Process ``r`` seeds its global RNG with ``seed + r``, so a random draw that is not shared
   across processes is caught. The same loss *without* the gather does not match (the control below), so the
   comparison can fail. At model level, 2 processes with GradCache (``mini_batch_size=2``) and the gather reproduce
   the single-process, uncached loss and DDP-averaged parameter gradients of a float64 tiny BERT.

2. **GradCache** (one process): with dropout off, the loss and every parameter gradient with ``mini_batch_size=2``
   equal the uncached ones to 1e-5 (relative, float64 tiny model), while the encoder only ever sees mini-batches of 2
   (so the test fails if the cache is bypassed); with dropout on, the gradient pass reproduces the first pass's
   embeddings bit for bit. A naive mini-batching (the loss of each mini-batch on its own) does not match.
"""

from __future__ import annotations

import copy
from functools import partial

import pytest
import torch
from torch import nn

from st_hardneg.losses.adcse import AdversarialNegativesLoss
from st_hardneg.losses.focal import FocalInfoNCELoss
from st_hardneg.losses.hncse import HNCSELoss
from st_hardneg.losses.mixcse import MixCSELoss
from st_hardneg.testing import SYMMETRIC
from st_hardneg.testing.distributed import compare, gathered_loss_job, model_step, spawn_jobs

N, DIM = 8, 6
CLASSES = {"mixcse": MixCSELoss, "focal": FocalInfoNCELoss, "hncse": HNCSELoss, "adcse": AdversarialNegativesLoss}

#: (id, loss class, keyword arguments, number of columns): every loss and each of its modes
CASES = [
    ("mixcse-paper-symmetric-shift", "mixcse", {**SYMMETRIC}, 2),
    ("mixcse-paper-symmetric-shift-negatives", "mixcse", {**SYMMETRIC}, 3),
    ("mixcse-paper-single-random-seeded", "mixcse",
     {**SYMMETRIC, "reverse_mix": False, "partner": "random", "seed": 3}, 2),
    ("mixcse-paper-random-unseeded-no-sg-focal", "mixcse",
     {**SYMMETRIC, "partner": "random", "stop_gradient": False, "focal_m": 0.3}, 2),
    ("mixcse-paper-one-direction-hardest", "mixcse", {"partner": "hardest"}, 2),
    ("mixcse-paper-symmetric-hardest-negatives", "mixcse", {**SYMMETRIC, "partner": "hardest"}, 3),
    ("mixcse-paper-dot-joint-hardness", "mixcse",
     {"directions": ("query_to_doc", "query_to_query", "doc_to_query", "doc_to_doc"), "similarity_fct": "dot_score",
      "hardness_mode": "all_negatives", "hardness_strength": 5.0}, 3),
    ("mixcse-official-shift", "mixcse", {"layout": "official", "lam": 0.6}, 2),
    ("mixcse-official-random-no-reverse", "mixcse",
     {"layout": "official", "partner": "random", "reverse_mix": False, "seed": 5}, 3),
    ("focal", "focal", {}, 2),
    ("focal-symmetric-negatives", "focal", {**SYMMETRIC, "m": 0.2}, 3),
    ("hncse-pm", "hncse", {"mode": "pm", "pm_threshold": 0.2}, 2),
    ("hncse-pm-single-weight-grad-negatives", "hncse",
     {"mode": "pm", "pm_threshold": 0.2, "pm_single": True, "pm_weight_gradient": True}, 3),
    ("hncse-hnm-seeded", "hncse", {"mode": "hnm", "k": 3, "num_mixed": 5, "seed": 11}, 2),
    ("hncse-hnm-unseeded-adaptive", "hncse", {"mode": "hnm", "k": 4, "num_mixed": 6, "alpha": "adaptive"}, 2),
    ("hncse-hnm-single", "hncse", {"mode": "hnm", "k": 3, "hnm_single": True}, 2),
    ("hncse-both-negatives", "hncse", {"mode": "both", "pm_threshold": 0.2, "k": 3, "num_mixed": 5, "seed": 2}, 3),
    ("adcse-adversaries", "adcse", {"num_adversaries": 4, "seed": 7}, 2),
    ("adcse-adversaries-negatives", "adcse", {"num_adversaries": 4, "seed": 7}, 3),
    ("adcse-eq5", "adcse", {"num_adversaries": 4, "seed": 7, "in_batch_keys": False}, 3),
    ("adcse-no-adversaries", "adcse", {"num_adversaries": 0}, 2),
    # false-negative control on the gathered batch (row i's near-duplicate i + N/2 lives on the other process)
    # margin 0: the tiny random model's cosines lie within 1e-3 of each other, so any larger margin masks every
    # candidate (a batch with no usable row, an error); 0 masks about half of them
    ("mixcse-hardest-margin-negatives", "mixcse", {"partner": "hardest", "margin": 0.0}, 3),
    ("focal-relative-margin-negatives", "focal", {"margin": 0.0, "margin_strategy": "relative"}, 3),
    ("hncse-both-margin-all-pool", "hncse", {"mode": "both", "pm_threshold": 0.2, "k": 3, "num_mixed": 5, "seed": 2,
                                             "margin": 0.0, "hnm_pool": "all_negatives"}, 3),
    # (AdCSE's adversaries alone no longer keep a row usable: the same margin 0 as the others)
    ("adcse-margin-negatives", "adcse", {"num_adversaries": 4, "seed": 7, "margin": 0.0}, 3),
]
IDS = [case[0] for case in CASES]


class StubEncoder(nn.Module):
    """The least a loss needs from a model at embedding level: parameters and an embedding dimension."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(DIM, DIM)

    def get_embedding_dimension(self):
        return DIM


def build(name: str, kwargs: dict, gather: bool = True):
    """Embedding-level factory (no text model; AdCSE gets a stub for its adversaries' dimension)."""
    model = StubEncoder() if name == "adcse" else None
    return CLASSES[name](model, gather_across_devices=gather, **kwargs)


def embeddings(num_columns: int, seed: int = 0) -> list[torch.Tensor]:
    """Positives near their anchors, and row i near row i + N/2 (which lives on the other process), so that the
    hardest negatives, the PM partners and the HNM pools cross the process boundary."""
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(N // 2, DIM, generator=g, dtype=torch.float64)
    anchors = torch.cat([base, base + 0.4 * torch.randn(N // 2, DIM, generator=g, dtype=torch.float64)])
    columns = [anchors, anchors + 0.5 * torch.randn(N, DIM, generator=g, dtype=torch.float64)]
    columns += [torch.randn(N, DIM, generator=g, dtype=torch.float64) for _ in range(num_columns - 2)]
    return columns


def assert_exact(result, tol=1e-5):
    world_size = result["world_size"]
    assert result["distributed_loss_mean"] == pytest.approx(result["single_loss"], abs=tol)
    for dist_grad, single_grad in zip(result["distributed_grads"], result["single_grads"], strict=True):
        torch.testing.assert_close(dist_grad / world_size, single_grad, rtol=tol, atol=tol * 1e-2)


# ------------------------------------------------------------------------------------------- AdCSE: the adversaries
def adversary_gradient(make_loss, columns, seed):
    """Loss, embedding gradients and the adversaries' accumulated ascent gradient, then the bank after one step."""
    torch.manual_seed(seed)
    loss_fn = make_loss()
    leaves = [c.detach().clone().requires_grad_(True) for c in columns]
    loss = loss_fn.compute_loss_from_embeddings(leaves, None)
    loss.backward()
    bank = loss_fn.adversary_bank
    window = (bank._grad_sum.clone(), bank.pending_micro_batches)
    bank.step()  # all-reduce mean over the processes (of identical gradients when gathered)
    return float(loss.detach()), [leaf.grad.clone() for leaf in leaves], window, bank.weight.detach().clone()


def _adversary_worker(rank, world_size, make_loss, columns, seed):
    n = N // world_size
    return adversary_gradient(make_loss, [c[rank * n:(rank + 1) * n] for c in columns], seed + rank)


# ------------------------------------------------------------------------------------------- model level
TEXT_COLUMNS = [
    ["a man plays the guitar.", "a woman plays the piano.", "the dog runs in the park.", "the cat eats food.",
     "children read a book.", "the sky is blue.", "people walk to the station.", "one car drives on the road."],
    ["a man plays a guitar.", "the woman plays the piano.", "a dog runs in the park.", "the cat eats the food.",
     "the children read a book.", "the sky is very blue.", "people walk to a station.", "a car drives on the road."],
]

#: (id, loss class, keyword arguments) trained at model level: GradCache + gather vs one uncached process
MODEL_CASES = [
    ("mixcse", "mixcse", {"partner": "random", "seed": 1}),
    ("mixcse-official", "mixcse", {"layout": "official"}),
    ("focal", "focal", {**SYMMETRIC}),
    ("hncse-both", "hncse", {"mode": "both", "pm_threshold": 0.2, "k": 3, "num_mixed": 5, "seed": 4}),
    ("adcse-untied", "adcse", {"num_adversaries": 4, "seed": 0}),
    ("adcse-tied", "adcse", {"num_adversaries": 4, "seed": 0, "untied": False}),
]
MODEL_IDS = [case[0] for case in MODEL_CASES]

#: TEXT_COLUMNS with one positive text repeated across the process boundary (row 5 = row 1): mask_duplicates must
#: find it through the text keys gathered from the other process
DUPLICATE_TEXT_COLUMNS = [TEXT_COLUMNS[0], [*TEXT_COLUMNS[1][:5], TEXT_COLUMNS[1][1], *TEXT_COLUMNS[1][6:]]]


def no_dropout(model):
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0  # AdCSE puts its key encoder in train mode: dropout must be off in the weights' copy
    return model


def build_for_model(name: str, kwargs: dict, model, gather: bool = False, mini_batch_size: int | None = None):
    return CLASSES[name](no_dropout(model), gather_across_devices=gather, mini_batch_size=mini_batch_size, **kwargs)


def _adcse_sync_worker(rank, world_size, model_dir):
    """An AdCSE loss whose adversaries (unseeded, RNG seeded by rank) and key encoder differ between processes."""
    from st_hardneg.models import load_model

    torch.manual_seed(100 + rank)
    model = load_model(model_dir, pooling="mean", max_seq_length=32, device="cpu")
    loss = AdversarialNegativesLoss(model, num_adversaries=4, gather_across_devices=True)
    with torch.no_grad():
        next(loss.key_encoder.parameters()).add_(rank)
    before = (loss.adversaries.clone(), next(loss.key_encoder.parameters()).clone())
    loss([dict(model.tokenize(column[:2])) for column in TEXT_COLUMNS], None)
    return before, (loss.adversaries.clone(), next(loss.key_encoder.parameters()).clone())


@pytest.fixture(scope="module")
def spawned(tmp_path_factory, tiny_model_dir):
    """Every 2-process job of this module, in one spawn: {name: [rank 0 result, rank 1 result]}."""
    names, jobs = [], []
    for case_id, name, kwargs, num_columns in CASES:
        names.append(case_id)
        jobs.append(gathered_loss_job(partial(build, name, kwargs), embeddings(num_columns)))
    for case_id, name, kwargs, num_columns in CONTROL_CASES:  # the controls: the same losses without the gather
        names.append("local-" + case_id)
        jobs.append(gathered_loss_job(partial(build, name, kwargs, gather=False), embeddings(num_columns)))
    adcse = partial(build, "adcse", {"num_adversaries": 4, "seed": 7})
    names.append("adversaries")
    jobs.append((_adversary_worker, (adcse, embeddings(3), 0)))
    for case_id, name, kwargs in MODEL_CASES:
        names.append("model-" + case_id)
        make = partial(build_for_model, name, kwargs, gather=True, mini_batch_size=2)
        jobs.append((model_step, (make, str(tiny_model_dir), TEXT_COLUMNS, 0, "mean")))
    for case_id, name, kwargs in MODEL_CASES:  # 4 local rows in mini-batches (and loss chunks) of 3: 3 + 1
        names.append("model-uneven-" + case_id)
        make = partial(build_for_model, name, kwargs, gather=True, mini_batch_size=3)
        jobs.append((model_step, (make, str(tiny_model_dir), TEXT_COLUMNS, 0, "mean")))
    names.append("model-duplicate-text")
    make = partial(build_for_model, "mixcse", {"partner": "hardest"}, gather=True, mini_batch_size=2)
    jobs.append((model_step, (make, str(tiny_model_dir), DUPLICATE_TEXT_COLUMNS, 0, "mean")))
    names.append("adcse-sync")
    jobs.append((_adcse_sync_worker, (str(tiny_model_dir),)))
    results = spawn_jobs(jobs, tmp_path_factory.mktemp("spawn"))
    return dict(zip(names, results, strict=True))


@pytest.mark.parametrize("case_id,name,kwargs,num_columns", CASES, ids=IDS)
def test_two_processes_equal_one(spawned, case_id, name, kwargs, num_columns):
    make = partial(build, name, kwargs)
    result = compare(make, embeddings(num_columns), None, spawned[case_id])
    assert_exact(result)
    # every column receives a gradient (the explicit negatives and AdCSE's keys too)
    assert all(g.abs().max() > 1e-6 for g in result["single_grads"])


#: Eq. 5 (in_batch_keys=False) never looks at another row (own key, own negatives, adversaries), so there the local
#: loss is already the global one: no control for it
CONTROL_CASES = [case for case in CASES if case[0] != "adcse-eq5"]


@pytest.mark.parametrize("case_id,name,kwargs,num_columns", CONTROL_CASES, ids=[c[0] for c in CONTROL_CASES])
def test_without_the_gather_two_processes_do_not_match(spawned, case_id, name, kwargs, num_columns):
    """The control: the same losses computed on each process's half only. Neither the loss nor the gradients match
    the whole batch, so the comparison above would catch a missing gather."""
    result = compare(partial(build, name, kwargs), embeddings(num_columns), None, spawned["local-" + case_id])
    with pytest.raises(AssertionError):
        assert_exact(result)
    assert abs(result["distributed_loss_mean"] - result["single_loss"]) > 1e-3


def test_the_modes_really_reach_across_processes():
    """The fixture makes the hard structure cross the process boundary: PM mixes some positives (with partners on
    the other half) and the hardest partner of a row is its twin N/2 rows away."""
    columns = embeddings(2)
    loss = build("hncse", {"mode": "pm", "pm_threshold": 0.2}, gather=False)
    loss.compute_loss_from_embeddings(columns, None)
    assert 0.0 < loss.diagnostics["pm_mixed"] < 1.0
    a = torch.nn.functional.normalize(columns[0], dim=-1)
    p = torch.nn.functional.normalize(columns[1], dim=-1)
    cos = (a @ p.T).fill_diagonal_(-2.0)
    twins = (torch.arange(N) + N // 2) % N
    assert (cos.argmax(dim=1) == twins).float().mean() >= 0.75


def test_adcse_adversary_gradient_and_step_are_those_of_the_global_batch(spawned):
    make = partial(build, "adcse", {"num_adversaries": 4, "seed": 7})
    columns = embeddings(3)
    single_loss, single_grads, (single_window, count), single_weight = adversary_gradient(make, columns, 0)
    assert count == 1 and single_window.abs().max() > 1e-4
    ranks = spawned["adversaries"]
    assert sum(r[0] for r in ranks) / 2 == pytest.approx(single_loss, abs=1e-5)
    for r in ranks:
        window, pending = r[2]
        assert pending == 1
        torch.testing.assert_close(r[3], single_weight, rtol=1e-5, atol=1e-7)  # the same step everywhere
    # each rank computes its own rows only: its window holds its rows' gradient, and the all-reduce of the
    # step averages them into the global batch's gradient
    windows = [r[2][0] for r in ranks]
    assert not torch.allclose(windows[0], windows[1], rtol=1e-3)
    torch.testing.assert_close((windows[0] + windows[1]) / 2, single_window, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(torch.cat([r[1][1] for r in ranks]) / 2, single_grads[1], rtol=1e-5, atol=1e-7)


def test_adcse_starts_from_rank0_state_on_every_process(spawned):
    """Adversaries drawn from different RNG states and key encoders that differ are replaced by rank 0's at the first
    training forward, so the EMA and the averaged adversary steps keep every process identical from there."""
    (before0, after0), (before1, after1) = spawned["adcse-sync"]
    assert not torch.equal(before0[0], before1[0]) and not torch.equal(before0[1], before1[1])
    for a, b0, a1 in zip(after0, before0, after1, strict=True):
        assert torch.equal(a, b0) and torch.equal(a1, b0)


@pytest.mark.parametrize("case_id,name,kwargs", MODEL_CASES, ids=MODEL_IDS)
def test_gradcache_and_gather_in_two_processes_equal_one_uncached(spawned, tiny_model_dir, case_id, name, kwargs):
    """2 processes x (mini-batches of 2 + gather) = 1 uncached process on the whole batch: the same loss and the same
    DDP-averaged parameter gradients, 1e-5 relative (float64 tiny BERT, dropout off).

    The model uses mean pooling: the random tiny BERT's CLS vectors are nearly collinear (every pairwise cosine above
    0.9999), which makes the parameter gradients a small difference of large terms; with the loss math in float32,
    rounding alone then moves them by about 2e-3 relative (rescaling the embeddings by 1 + 3e-7 does), whatever the
    process split. Mean-pooled embeddings (cosines down to 0.9) are well conditioned, as trained encoders' are."""
    assert_equal_to_one_process(spawned["model-" + case_id], tiny_model_dir, name, kwargs)


def assert_equal_to_one_process(results, tiny_model_dir, name, kwargs):
    """The 2 processes' mean loss and each process's DDP-averaged parameter gradients equal one uncached process's
    on the whole batch, 1e-5 relative."""
    single_loss, single_grads = model_step(0, 1, partial(build_for_model, name, kwargs), str(tiny_model_dir),
                                           TEXT_COLUMNS, 0, "mean")
    assert sum(loss for loss, _ in results) / 2 == pytest.approx(single_loss, rel=1e-5)
    compared = 0
    for param, g in single_grads.items():
        for _, grads in results:
            if g is None:
                assert grads[param] is None, param
            elif g.norm() > 1e-12:
                assert (grads[param] - g).norm() <= 1e-5 * g.norm(), param
                compared += 1
    assert compared > 20


@pytest.mark.parametrize("case_id,name,kwargs", MODEL_CASES, ids=MODEL_IDS)
def test_uneven_chunks_in_two_processes_equal_one_uncached(spawned, tiny_model_dir, case_id, name, kwargs):
    """As above with mini_batch_size=3 on 4 local rows: the encoder's mini-batches and the loss's chunks of anchor
    rows are 3 + 1 on each process (uneven chunks across 2 processes)."""
    assert_equal_to_one_process(spawned["model-uneven-" + case_id], tiny_model_dir, name, kwargs)


# ------------------------------------------------------------------------------------------- GradCache, one process
class ForwardRecorder:
    """Batch size, grad mode and output embeddings of every forward of a module."""

    def __init__(self, model):
        self.records = []
        self.handle = model.register_forward_hook(self._hook)

    def _hook(self, module, args, output):
        self.records.append((output["input_ids"].shape[0], torch.is_grad_enabled(),
                             output["sentence_embedding"].detach().clone()))

    def remove(self):
        self.handle.remove()


def text_columns(model, sentences, num_columns):
    n = 6
    return [dict(model.tokenize(sentences[i * 3: i * 3 + n])) for i in range(num_columns)]


def run(loss, columns):
    loss.model.zero_grad(set_to_none=True)
    torch.manual_seed(0)  # unseeded random draws (partners, HNM pairs) start from the same global RNG state
    value = loss(columns, None)
    value.backward()
    return value.detach(), {k: None if p.grad is None else p.grad.clone() for k, p in loss.model.named_parameters()}


def assert_grads_close(cached, full, rel=1e-5):
    compared = 0
    for name, g_full in full.items():
        if g_full is None:
            assert cached[name] is None, name
            continue
        err = (cached[name] - g_full).norm().item()
        assert err <= rel * g_full.norm().item() + 1e-12, f"{name}: {err:.3e} vs {g_full.norm():.3e}"
        compared += 1
    assert compared > 10


def fresh(tiny_model_dir):
    from st_hardneg.models import load_model

    return load_model(tiny_model_dir, pooling="cls", max_seq_length=32, device="cpu").double().eval()


@pytest.mark.parametrize("case_id,name,kwargs,num_columns", CASES, ids=IDS)
def test_gradcache_equals_uncached(tiny_model_dir, tiny_sentences, case_id, name, kwargs, num_columns):
    model = no_dropout(fresh(tiny_model_dir))
    columns = text_columns(model, tiny_sentences, num_columns)
    full = build_for_model(name, kwargs, model)
    full_loss, full_grads = run(full, columns)
    cached = build_for_model(name, kwargs, model, mini_batch_size=2)
    assert cached.uses_gradient_cache and cached.get_config_dict()["mini_batch_size"] == 2
    calls, windows = [], []
    # the batch enters the loss once, through the one compute template, followed (a loss that computes its rows a
    # chunk of anchors at a time) by one window_rows per chunk
    inner = cached.compute
    cached.compute = lambda e, lab=None, **kw: calls.append(e[0].size(0)) or inner(e, lab, **kw)
    if cached.supports_row_chunks:
        inner_rows = cached.window_rows
        cached.window_rows = lambda batch: windows.append(batch.row_range) or inner_rows(batch)
    recorder = ForwardRecorder(model)
    cached_loss, cached_grads = run(cached, columns)
    recorder.remove()
    assert cached_loss.item() == pytest.approx(full_loss.item(), rel=1e-5)
    assert_grads_close(cached_grads, full_grads)
    assert calls == [6]  # the loss sees the whole batch, once
    assert windows == ([(0, 2), (2, 4), (4, 6)] if cached.supports_row_chunks else [])
    # the encoder only ever saw mini-batches of 2: first without, then with gradient
    assert {size for size, _, _ in recorder.records} == {2}
    grad_modes = [grad for _, grad, _ in recorder.records]
    cached_columns = 1 if name == "adcse" and kwargs.get("untied", True) else num_columns
    assert grad_modes == [False] * 3 * cached_columns + [True] * 3 * cached_columns


def test_naive_mini_batching_does_not_match(tiny_model_dir, tiny_sentences):
    """The control of the cache test: the mean loss of the mini-batches taken separately is not the batch's loss
    (each mini-batch loses the other mini-batches' negatives), so the cache must really assemble the whole batch."""
    model = fresh(tiny_model_dir)
    columns = text_columns(model, tiny_sentences, 2)
    full_loss, _ = run(MixCSELoss(model), columns)
    from sentence_transformers.base.losses.gradcache import _create_minibatch

    with torch.no_grad():
        naive = sum(float(MixCSELoss(model)([_create_minibatch(c, b, b + 2) for c in columns], None))
                    for b in range(0, 6, 2)) / 3
    assert abs(naive - full_loss.item()) > 1e-2


@pytest.mark.parametrize("name", ["mixcse", "focal", "hncse", "adcse"])
def test_gradcache_replays_dropout(tiny_model_dir, tiny_sentences, name):
    from st_hardneg.models import load_model

    model = load_model(tiny_model_dir, pooling="cls", max_seq_length=32, device="cpu").train()  # dropout 0.1
    kwargs = {"hncse": {"mode": "hnm", "k": 3, "num_mixed": 4}, "adcse": {"num_adversaries": 4}}.get(name, {})
    loss = CLASSES[name](model, mini_batch_size=2, **kwargs)
    columns = text_columns(model, tiny_sentences, 2)
    recorder = ForwardRecorder(model)
    torch.manual_seed(0)
    value = loss(columns, None)
    first = [emb for _, grad, emb in recorder.records if not grad]
    value.backward()
    replay = [emb for _, grad, emb in recorder.records if grad]
    recorder.remove()
    assert len(first) == len(replay) == (3 if name == "adcse" else 6)
    for a, b in zip(first, replay, strict=True):
        assert torch.equal(a, b)
    with torch.no_grad():  # dropout is on: the same inputs embedded again differ
        again = model(columns[0])["sentence_embedding"][:2]
    assert not torch.allclose(again, first[0])


def test_adcse_cache_counts_one_forward_and_updates_once_per_step(tiny_model_dir, tiny_sentences):
    """With the cache, AdCSE's adversary window and forward counter see one micro-batch per forward, the window holds
    the uncached gradient, and the EMA / adversary updates happen once per optimizer step."""
    model = no_dropout(fresh(tiny_model_dir))
    columns = text_columns(model, tiny_sentences, 2)
    full = AdversarialNegativesLoss(model, num_adversaries=4, seed=0)
    run(full, columns)
    cached = AdversarialNegativesLoss(model, num_adversaries=4, seed=0, mini_batch_size=2)
    run(cached, columns)
    assert cached.adversary_bank.pending_micro_batches == 1 and cached.step_clock.forwards_since_step == 1
    torch.testing.assert_close(cached.adversary_bank._grad_sum, full.adversary_bank._grad_sum, rtol=1e-5, atol=1e-8)
    assert all(p.grad is None for p in cached.key_encoder.parameters())
    before = copy.deepcopy(cached.adversaries)
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    assert cached.ema_updates == 1 and cached.adversary_updates == 1
    assert cached.adversary_bank.pending_micro_batches == 0 and cached.step_clock.forwards_since_step == 0
    assert not torch.equal(before, cached.adversaries)


def test_bad_scaling_arguments(tiny_model):
    for cls in CLASSES.values():
        for bad in (0, -2, 1.5, True):
            with pytest.raises(ValueError, match="mini_batch_size"):
                cls(tiny_model, mini_batch_size=bad)
        with pytest.raises(ValueError, match="mini_batch_num_tokens"):
            cls(tiny_model, mini_batch_num_tokens=0)
        with pytest.raises(ValueError, match="gather_across_devices"):
            cls(tiny_model, gather_across_devices="yes")
        config = cls(tiny_model, gather_across_devices=True, mini_batch_num_tokens=64).get_config_dict()
        assert config["gather_across_devices"] is True and config["mini_batch_num_tokens"] == 64
    with pytest.raises(ValueError, match="need a model"):
        MixCSELoss(None, mini_batch_size=4)
    assert MixCSELoss(StubEncoder(), mini_batch_size=4).uses_gradient_cache  # any module can be cached
    assert not MixCSELoss(None).uses_gradient_cache


def test_reduce_refuses_rows_of_another_batch():
    from st_hardneg.losses.batch import Batch, BatchState

    loss = MixCSELoss(None, gather_across_devices=True)
    units = torch.nn.functional.normalize(torch.randn(8, 4), dim=-1)
    batch = Batch(units, units, units[:0])
    batch.state = BatchState(local_rows=(slice(4, 8), 8))  # what a gathering prepare_batch on rank 1 of 2 leaves
    rows = torch.arange(8, dtype=torch.float64)
    assert loss.ranking.reduce(rows, batch).item() == pytest.approx((4 + 5 + 6 + 7) / 4)
    assert loss.ranking.reduce(rows).item() == pytest.approx(3.5)  # without the batch: one process, every row
    with pytest.raises(ValueError, match="gathered batch"):
        loss.ranking.reduce(rows[:6], batch)


def test_duplicate_text_across_processes_is_masked_like_in_one_process(spawned, tiny_model_dir):
    """A positive text that also occurs on the other process: the gathered text keys mask it exactly as one process
    holding the whole batch does (same loss, same DDP-averaged parameter gradients), and the mask matters: without
    mask_duplicates the single-process loss differs."""
    single_loss, single_grads = model_step(0, 1, partial(build_for_model, "mixcse", {"partner": "hardest"}),
                                           str(tiny_model_dir), DUPLICATE_TEXT_COLUMNS, 0, "mean")
    unmasked_loss, _ = model_step(0, 1, partial(build_for_model, "mixcse", {"partner": "hardest",
                                                                             "mask_duplicates": False}),
                                  str(tiny_model_dir), DUPLICATE_TEXT_COLUMNS, 0, "mean")
    assert abs(unmasked_loss - single_loss) > 1e-3
    results = spawned["model-duplicate-text"]
    assert sum(loss for loss, _ in results) / 2 == pytest.approx(single_loss, rel=1e-5)
    compared = 0
    for param, g in single_grads.items():
        for _, grads in results:
            if g is not None and g.norm() > 1e-12:  # 1e-5 relative per parameter, as the model-level test above
                assert (grads[param] - g).norm() <= 1e-5 * g.norm(), param
                compared += 1
    assert compared > 20
