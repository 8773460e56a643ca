"""Router (query / document towers, ``router_mapping``) models with every loss: both towers train, with the queue,
GradCache and gathering; each tower's gradient equals the loss's equation written out here; AdCSE's key encoder only
embeds the columns that take the anchors' route (the rest go through the live model), and the one combination that
cannot hold (AdCSE untied with ``queue_source="ema"``) is refused, naming ``Router``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from sentence_transformers import SentenceTransformer
from sentence_transformers.base.modules import Router
from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

from st_hardneg import AdversarialNegativesLoss, FocalInfoNCELoss, HNCSELoss, MixCSELoss
from st_hardneg.testing import make_tiny_model_dir
from st_hardneg.testing.distributed import average_parameter_grads, spawn_jobs

TAU = 0.05
SENTENCES = ["a man plays the guitar.", "a woman plays the piano.", "the dog runs in the park.", "the cat eats food.",
             "children read a book.", "the sky is blue.", "people walk to the station.", "one car drives on the road."]
QUERIES = ["man guitar", "woman piano", "dog park", "cat food"]
DOCUMENTS = ["a man plays the guitar.", "a woman plays the piano.", "the dog runs in the park.", "the cat eats food."]
LOSSES = {"mixcse": MixCSELoss, "focal": FocalInfoNCELoss, "hncse": HNCSELoss, "adcse": AdversarialNegativesLoss}


def _tower(path: Path) -> list:
    transformer = Transformer(str(path), max_seq_length=32)
    return [transformer, Pooling(transformer.get_embedding_dimension(), "cls")]


@pytest.fixture(scope="module")
def router_dir(tmp_path_factory) -> Path:
    """A saved ``Router.for_query_document`` model: two tiny BERTs with different random weights."""
    root = tmp_path_factory.mktemp("router")
    router = Router.for_query_document(_tower(make_tiny_model_dir(root / "q", seed=0)),
                                       _tower(make_tiny_model_dir(root / "d", seed=1)))
    SentenceTransformer(modules=[router], device="cpu").save(str(root / "model"))
    return root / "model"


def _load(router_dir: Path) -> SentenceTransformer:
    return SentenceTransformer(str(router_dir), device="cpu")


def _tower_of(name: str) -> str:
    return "query" if ".query." in name else "document"


def _largest_change(model, before: dict) -> dict[str, float]:
    out = {"query": 0.0, "document": 0.0}
    for name, p in model.named_parameters():
        tower = _tower_of(name)
        out[tower] = max(out[tower], float((p.detach() - before[name]).abs().max()))
    return out


def _train(model, loss, tmp_path, steps=2):
    from datasets import Dataset
    from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments

    args = SentenceTransformerTrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=4, learning_rate=1e-3, report_to=[], seed=0,
        max_steps=steps, save_strategy="no", disable_tqdm=True,
        router_mapping={"anchor": "query", "positive": "document"})
    dataset = Dataset.from_dict({"anchor": SENTENCES, "positive": SENTENCES})
    SentenceTransformerTrainer(model=model, args=args, train_dataset=dataset, loss=loss).train()


def test_the_router_model_has_two_towers(router_dir):
    model = _load(router_dir)
    towers = {_tower_of(name) for name, _ in model.named_parameters()}
    assert towers == {"query", "document"}
    query = model.encode_query(["a man"], convert_to_tensor=True)
    document = model.encode_document(["a man"], convert_to_tensor=True)
    assert not torch.allclose(query, document)  # the routes are different towers


@pytest.mark.parametrize("extra", [{}, {"queue_size": 16}, {"mini_batch_size": 2}], ids=["plain", "queue", "gradcache"])
@pytest.mark.parametrize("name", list(LOSSES))
def test_every_loss_moves_both_towers(router_dir, tmp_path, name, extra):
    """2 Trainer steps at lr 1e-3 with router_mapping: both towers' parameters change (AdCSE's document tower
    stayed at 0.0 when its documents only went through the momentum key encoder)."""
    model = _load(router_dir)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    loss = LOSSES[name](model, seed=0, **extra)
    _train(model, loss, tmp_path)
    change = _largest_change(model, before)
    assert change["query"] > 1e-4, change
    assert change["document"] > 1e-4, change


def test_adcse_key_encoder_embeds_only_the_anchors_route(router_dir):
    model = _load(router_dir)
    loss = AdversarialNegativesLoss(model, num_adversaries=4, seed=0)
    routed = [model.preprocess(QUERIES, task="query"), model.preprocess(DOCUMENTS, task="document"),
              model.preprocess(DOCUMENTS, task="document")]
    assert loss.key_columns(routed) == []
    assert loss.frozen_columns(routed) == {}
    same = [model.preprocess(QUERIES, task="query"), model.preprocess(DOCUMENTS, task="query")]
    assert loss.key_columns(same) == [1]  # the paper's case: a key on the anchors' route is the key encoder's
    assert loss.frozen_columns(same) == {1: loss.key_encoder}
    mixed = [*same, model.preprocess(DOCUMENTS, task="document")]
    assert loss.key_columns(mixed) == [1]
    # a model without a Router: every column after the anchors is a key (unchanged)
    tied = AdversarialNegativesLoss(model, num_adversaries=4, seed=0, untied=False)
    assert tied.key_columns(routed) == []


def test_adcse_untied_ema_queue_on_a_router_is_refused_naming_router(router_dir, tmp_path):
    model = _load(router_dir)
    loss = AdversarialNegativesLoss(model, num_adversaries=4, seed=0, queue_size=16, queue_source="ema")
    with pytest.raises(ValueError, match="Router"):
        _train(model, loss, tmp_path, steps=1)


def test_adcse_tied_ema_queue_on_a_router_moves_both_towers(router_dir, tmp_path):
    """untied=False: the queue keeps its own key encoder, a copy of the whole model, which follows every route."""
    model = _load(router_dir)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    loss = AdversarialNegativesLoss(model, num_adversaries=4, seed=0, untied=False, queue_size=16,
                                    queue_source="ema")
    _train(model, loss, tmp_path)
    change = _largest_change(model, before)
    assert change["query"] > 1e-4 and change["document"] > 1e-4, change
    assert loss.queue is not None and loss.queue.filled == 8


# ------------------------------------------------------------------ each tower's gradient, by hand
def _cos(a, b):
    return (a * b).sum() / (torch.sqrt((a * a).sum()) * torch.sqrt((b * b).sum()))


def _unit(a):
    return a / torch.sqrt((a * a).sum())


def _cross_entropy(logits: list, target: int):
    row = torch.stack(logits)
    return -(row[target] - torch.logsumexp(row, 0))


def _mixcse_reference(q, d, loss):
    """MixCSE Eq. 2-3 (one direction, shift partner, the mix detached): row i over [q_i·d_b, q_i·mix_i] / τ,
    mix_i = unit(λ·unit(d_i) + (1-λ)·unit(d_{i+1}))."""
    n, lam, total = q.size(0), loss.lam, 0.0
    for i in range(n):
        mix = _unit(lam * _unit(d[i]) + (1 - lam) * _unit(d[(i + 1) % n])).detach()
        total = total + _cross_entropy([_cos(q[i], d[b]) / TAU for b in range(n)] + [_cos(q[i], mix) / TAU], i)
    return total / n


def _focal_reference(q, d, loss):
    """Focal-InfoNCE Eq. 2: positive s²/τ, negatives s(s + m)/τ."""
    n, m, total = q.size(0), loss.m, 0.0
    for i in range(n):
        logits = [(_cos(q[i], d[b]) ** 2 if b == i else _cos(q[i], d[b]) * (_cos(q[i], d[b]) + m)) / TAU
                  for b in range(n)]
        total = total + _cross_entropy(logits, i)
    return total / n


def _hncse_reference(q, d, loss):
    """HNCSE positive mixing (Eq. 2, mixes with gradient, weights as numbers): p_i replaces d_i as positive and as
    in-batch negative; row i over [q_i·p_b] / τ."""
    n, mixed = q.size(0), []
    for i in range(n):
        sims = [float(_cos(q[i], d[j]).detach()) for j in range(n)]
        j = max((j for j in range(n) if j != i), key=lambda j: sims[j])
        d1, d2 = sims[i], sims[j]
        if d1 <= 0 or d1 + d2 <= 0 or (d1 > d2 and (d1 - d2) / d1 > loss.pm_threshold):
            mixed.append(_unit(d[i]))
        elif d1 > d2:
            mixed.append(_unit(loss.w1 * _unit(d[i]) + loss.w2 * _unit(d[j])))
        else:
            mixed.append(_unit(d1 / (d1 + d2) * _unit(d[i]) + d2 / (d1 + d2) * _unit(d[j])))
    total = 0.0
    for i in range(n):
        total = total + _cross_entropy([_cos(q[i], mixed[b]) / TAU for b in range(n)], i)
    return total / n


def _adcse_reference(q, d, loss):
    """AdCSE Eq. 5 with the in-batch keys: row i over [q_i·k_b, q_i·n_m] / τ; on a Router the keys k are the live
    document tower's (the adversaries n carry no gradient into the model)."""
    n, adversaries, total = q.size(0), loss.adversaries.detach().double(), 0.0
    for i in range(n):
        logits = [_cos(q[i], d[b]) / TAU for b in range(n)] + [_cos(q[i], a) / TAU for a in adversaries]
        total = total + _cross_entropy(logits, i)
    return total / n


REFERENCES = {"mixcse": _mixcse_reference, "focal": _focal_reference, "hncse": _hncse_reference,
              "adcse": _adcse_reference}


def _tower_grads(model) -> dict[str, torch.Tensor]:
    return {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("name", list(LOSSES))
@pytest.mark.parametrize("mini_batch_size", [None, 2], ids=["uncached", "gradcache"])
def test_each_towers_gradient_equals_the_equation(router_dir, name, mini_batch_size):
    """Queries through the query tower, documents through the document tower (float64, dropout off): the loss's
    gradient of every parameter of each tower equals autograd of the equation written out above."""
    model = _load(router_dir).double().eval()
    kwargs = {"num_adversaries": 3} if name == "adcse" else {}
    loss = LOSSES[name](model, seed=0, mini_batch_size=mini_batch_size, **kwargs)
    features = [model.preprocess(QUERIES, task="query"), model.preprocess(DOCUMENTS, task="document")]
    loss(features, None).backward()
    got = _tower_grads(model)
    model.zero_grad(set_to_none=True)
    q = model(model.preprocess(QUERIES, task="query"))["sentence_embedding"]
    d = model(model.preprocess(DOCUMENTS, task="document"))["sentence_embedding"]
    REFERENCES[name](q, d, loss).backward()
    want = _tower_grads(model)
    assert set(got) == set(want)
    assert {_tower_of(n) for n in want} == {"query", "document"}
    for tower in ("query", "document"):
        names = [n for n in want if _tower_of(n) == tower]
        assert max(float(want[n].abs().max()) for n in names) > 1e-6  # the comparison below can fail
        for n in names:
            torch.testing.assert_close(got[n], want[n], rtol=1e-7, atol=1e-9, msg=f"{name} {n}")


# ------------------------------------------------------------------ gathering: 2 processes = 1 process
def router_step(rank: int, world_size: int, name: str, model_dir: str, gather: bool, mini_batch_size: int | None
                ) -> tuple[float, dict[str, torch.Tensor]]:
    """One forward + backward of loss ``name`` on this process's half of the Router batch (float64, eval mode);
    parameter gradients averaged over the processes as DDP does."""
    model = SentenceTransformer(model_dir, device="cpu").double().eval()
    kwargs = {"num_adversaries": 3} if name == "adcse" else {}
    loss = LOSSES[name](model, seed=0, gather_across_devices=gather, mini_batch_size=mini_batch_size, **kwargs)
    half = len(QUERIES) // world_size
    rows = slice(rank * half, (rank + 1) * half)
    features = [model.preprocess(QUERIES[rows], task="query"), model.preprocess(DOCUMENTS[rows], task="document")]
    value = loss(features, None)
    value.backward()
    if world_size > 1:
        average_parameter_grads(model)
    return float(value.detach()), {n: p.grad.detach().clone() for n, p in model.named_parameters()
                                   if p.grad is not None}


def test_gathered_router_batches_equal_one_process(router_dir, tmp_path):
    """gather_across_devices with GradCache on 2 gloo processes, each half of the batch: the mean loss and the
    DDP-averaged gradients of both towers equal one process on the whole batch, for every loss."""
    jobs = [(router_step, (name, str(router_dir), True, 1)) for name in LOSSES]
    results = spawn_jobs(jobs, tmp_path)
    for name, per_rank in zip(LOSSES, results, strict=True):
        single_loss, single_grads = router_step(0, 1, name, str(router_dir), False, None)
        assert sum(value for value, _ in per_rank) / 2 == pytest.approx(single_loss, rel=1e-8), name
        grads = per_rank[0][1]
        assert {_tower_of(n) for n in grads} == {"query", "document"}
        for n, want in single_grads.items():
            torch.testing.assert_close(grads[n], want, rtol=1e-7, atol=1e-10, msg=f"{name} {n}")
