"""GradCache (st_hardneg.losses.gradcache) is exact: same loss and parameter gradients as the uncached forward.

The losses here are written in the test (a plain InfoNCE) or taken from sentence-transformers, so these tests hold
the caching machinery alone. Gradients are compared per parameter by relative norm:
``||g_cached - g_full|| <= 1e-5 * ||g_full||``. The exactness tests run the tiny model in float64: GradCache is
exact in exact arithmetic, and float64 keeps the summation-order noise (embedding 2 rows instead of 6 changes which
padding columns are trimmed and the order of the gradient sums; about 1e-5 relative in float32) far below the
tolerance, so a real discrepancy cannot hide in it.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from sentence_transformers.base.losses.gradcache import _create_minibatch
from sentence_transformers.sentence_transformer.losses import (
    CachedMultipleNegativesRankingLoss,
    MultipleNegativesRankingLoss,
)
from torch import nn

from st_hardneg.losses.gradcache import GradCached, GradCacheMixin
from st_hardneg.validation import check_optional_count

TAU = 0.05


class InfoNCE(GradCacheMixin, nn.Module):
    """Plain InfoNCE (anchor vs all positives and negatives) with optional caching and frozen columns."""

    def __init__(self, model, mini_batch_size=None, mini_batch_num_tokens=None, frozen=None):
        super().__init__()
        self.model = model
        self.mini_batch_size = mini_batch_size
        self.mini_batch_num_tokens = mini_batch_num_tokens
        self.frozen = dict(frozen or {})
        self.calls = 0

    def frozen_column_model(self, column):
        return self.frozen.get(column)

    def compute_loss_from_embeddings(self, embeddings, labels):
        self.calls += 1
        a = F.normalize(embeddings[0], dim=-1)
        c = F.normalize(torch.cat(embeddings[1:]), dim=-1)
        logits = a @ c.T / TAU
        return F.cross_entropy(logits, torch.arange(a.size(0)))

    def forward(self, sentence_features, labels):
        if self.uses_gradient_cache:
            return self.cached_forward(sentence_features, labels)
        embeddings = []
        for column, features in enumerate(sentence_features):
            module = self.frozen.get(column)
            if module is None:
                embeddings.append(self.model(features)["sentence_embedding"])
            else:
                with torch.no_grad():
                    embeddings.append(module(features)["sentence_embedding"])
        return self.compute_loss_from_embeddings(embeddings, labels)


def hand_infonce(embeddings) -> float:
    """InfoNCE by loops: mean_i -log(exp(cos(a_i, p_i)/tau) / sum_j exp(cos(a_i, c_j)/tau))."""
    a = [row / row.norm() for row in embeddings[0].double()]
    c = [row / row.norm() for col in embeddings[1:] for row in col.double()]
    total = 0.0
    for i, ai in enumerate(a):
        scores = [float(ai @ cj) / TAU for cj in c]
        total += -(scores[i] - math.log(sum(math.exp(s) for s in scores)))
    return total / len(a)


def features(model, sentences):
    return dict(model.tokenize(sentences))


def columns(model, sentences, n=6, k=3):
    """k columns of n sentences each (anchor, positive, negative), of different lengths."""
    return [features(model, sentences[i * n // 2: i * n // 2 + n]) for i in range(k)]


def run(loss, cols):
    loss.model.zero_grad(set_to_none=True)
    value = loss(cols, None)
    value.backward()
    grads = {name: None if p.grad is None else p.grad.detach().clone() for name, p in loss.model.named_parameters()}
    return value.detach(), grads


def assert_grads_close(cached, full, rel=1e-5):
    assert cached.keys() == full.keys()
    compared = 0
    for name, g_full in full.items():
        g_cached = cached[name]
        if g_full is None:
            assert g_cached is None, name
            continue
        assert g_cached is not None, f"{name}: no gradient with the cache"
        err = (g_cached - g_full).norm().item()
        assert err <= rel * g_full.norm().item() + 1e-12, f"{name}: |diff| {err:.3e} vs |g| {g_full.norm():.3e}"
        compared += 1
    assert compared > 10  # the tiny BERT's encoder weights all received gradients


class ForwardRecorder:
    """Batch size, grad mode and output embeddings of every forward of a SentenceTransformer."""

    def __init__(self, model):
        self.records = []
        self.handle = model.register_forward_hook(self._hook)

    def _hook(self, module, args, output):
        self.records.append((output["input_ids"].shape, torch.is_grad_enabled(),
                             output["sentence_embedding"].detach().clone()))

    def remove(self):
        self.handle.remove()


def test_cached_equals_uncached_with_dropout_off(tiny_model, tiny_sentences):
    tiny_model.eval().double()  # no dropout: both forwards are deterministic
    cols = columns(tiny_model, tiny_sentences)
    full_loss, full_grads = run(InfoNCE(tiny_model), cols)
    # the uncached reference is itself checked against the equation, computed by loops
    with torch.no_grad():
        embs = [tiny_model(c)["sentence_embedding"] for c in cols]
    assert full_loss.item() == pytest.approx(hand_infonce(embs), rel=1e-5)

    loss = InfoNCE(tiny_model, mini_batch_size=2)
    rec = ForwardRecorder(tiny_model)
    cached_loss, cached_grads = run(loss, cols)
    rec.remove()
    assert cached_loss.item() == pytest.approx(full_loss.item(), rel=1e-5)
    assert_grads_close(cached_grads, full_grads)
    assert loss.calls == 1  # the loss sees the whole batch once
    # the model only ever saw mini-batches of 2: 3 columns x 3 mini-batches without grad, then the same with grad
    assert [shape[0] for shape, _, _ in rec.records] == [2] * 18
    assert [grad for _, grad, _ in rec.records] == [False] * 9 + [True] * 9


def test_cached_with_a_token_budget_equals_uncached(tiny_model, tiny_sentences):
    tiny_model.eval().double()
    cols = columns(tiny_model, tiny_sentences)
    full_loss, full_grads = run(InfoNCE(tiny_model), cols)
    loss = InfoNCE(tiny_model, mini_batch_num_tokens=24)
    rec = ForwardRecorder(tiny_model)
    cached_loss, cached_grads = run(loss, cols)
    rec.remove()
    assert cached_loss.item() == pytest.approx(full_loss.item(), rel=1e-5)
    assert_grads_close(cached_grads, full_grads)
    lengths = [c["attention_mask"].sum(dim=1).tolist() for c in cols]
    assert max(max(ls) for ls in lengths) <= 24 < min(sum(ls) for ls in lengths)  # the budget does split
    assert len(rec.records) > 2 * len(cols) and max(shape[0] for shape, _, _ in rec.records) < 6


def test_replay_reproduces_the_first_pass_with_dropout_on(tiny_model, tiny_sentences):
    tiny_model.train()  # dropout 0.1 in the tiny BERT
    cols = columns(tiny_model, tiny_sentences, k=2)
    loss = InfoNCE(tiny_model, mini_batch_size=2)
    rec = ForwardRecorder(tiny_model)
    torch.manual_seed(0)
    value = loss(cols, None)
    first = [emb for _, grad, emb in rec.records if not grad]
    value.backward()
    replay = [emb for _, grad, emb in rec.records if grad]
    rec.remove()
    assert len(first) == len(replay) == 6
    for a, b in zip(first, replay, strict=True):
        assert torch.equal(a, b)  # bit-identical: the dropout masks were replayed
    # dropout is really on: the same mini-batch embedded again without the replayed RNG state differs
    with torch.no_grad():
        again = tiny_model(_create_minibatch(cols[0], 0, 2))["sentence_embedding"]
    assert not torch.allclose(again, first[0])
    # the loss returned is the loss of the first-pass embeddings
    assert value.item() == pytest.approx(hand_infonce([torch.cat(first[:3]), torch.cat(first[3:])]), rel=1e-5)


def test_frozen_column_is_embedded_without_gradient(tiny_model, tiny_sentences):
    tiny_model.eval().double()
    key_encoder = copy.deepcopy(tiny_model)
    key_encoder.requires_grad_(False)
    with torch.no_grad():  # make the key encoder differ from the online model, as an EMA copy does
        for p in key_encoder.parameters():
            p.mul_(0.9)
    cols = columns(tiny_model, tiny_sentences)
    frozen = {1: key_encoder, 2: key_encoder}
    full_loss, full_grads = run(InfoNCE(tiny_model, frozen=frozen), cols)
    with torch.no_grad():
        embs = [tiny_model(cols[0])["sentence_embedding"]] + [key_encoder(c)["sentence_embedding"] for c in cols[1:]]
    assert full_loss.item() == pytest.approx(hand_infonce(embs), rel=1e-5)

    online = ForwardRecorder(tiny_model)
    keys = ForwardRecorder(key_encoder)
    cached_loss, cached_grads = run(InfoNCE(tiny_model, mini_batch_size=2, frozen=frozen), cols)
    online.remove()
    keys.remove()
    assert cached_loss.item() == pytest.approx(full_loss.item(), rel=1e-5)
    assert_grads_close(cached_grads, full_grads)
    assert all(p.grad is None for p in key_encoder.parameters())
    # only the anchor column goes through the cache (3 mini-batches, twice); keys: 2 columns x 3, once, no grad
    assert [grad for _, grad, _ in online.records] == [False] * 3 + [True] * 3
    assert [grad for _, grad, _ in keys.records] == [False] * 6
    assert all(shape[0] == 2 for shape, _, _ in online.records + keys.records)


def test_wrapping_sentence_transformers_mnrl(tiny_model, tiny_sentences):
    tiny_model.eval().double()
    cols = columns(tiny_model, tiny_sentences)
    mnrl = MultipleNegativesRankingLoss(tiny_model)
    full_loss, full_grads = run(mnrl, cols)
    wrapped = GradCached(mnrl, mini_batch_size=2)
    assert wrapped.uses_gradient_cache and wrapped.model is tiny_model
    cached_loss, cached_grads = run(wrapped, cols)
    assert cached_loss.item() == pytest.approx(full_loss.item(), rel=1e-5)
    assert_grads_close(cached_grads, full_grads)
    st_cached_loss, st_cached_grads = run(CachedMultipleNegativesRankingLoss(tiny_model, mini_batch_size=2), cols)
    assert cached_loss.item() == pytest.approx(st_cached_loss.item(), rel=1e-5)
    assert_grads_close(cached_grads, st_cached_grads)
    assert wrapped.get_config_dict()["mini_batch_size"] == 2
    # the trainer re-points loss.model: it must reach the wrapped loss, not become a submodule of the wrapper
    other = copy.deepcopy(tiny_model)
    wrapped.model = other
    assert mnrl.model is other and wrapped.model is other and "model" not in wrapped._modules


def test_evaluation_mode_returns_the_plain_loss(tiny_model, tiny_sentences):
    tiny_model.eval().double()
    cols = columns(tiny_model, tiny_sentences)
    with torch.no_grad():
        full = InfoNCE(tiny_model)(cols, None)
        cached = InfoNCE(tiny_model, mini_batch_size=4)(cols, None)
    assert not cached.requires_grad
    assert cached.item() == pytest.approx(full.item(), rel=1e-5)


def test_bad_arguments(tiny_model):
    for bad in (0, -1, 2.0, True, "4"):
        with pytest.raises(ValueError, match="mini_batch_size"):
            check_optional_count(bad, "mini_batch_size")
    assert check_optional_count(None, "mini_batch_size") is None and check_optional_count(8, "mini_batch_size") == 8
    with pytest.raises(ValueError, match="mini_batch_size or mini_batch_num_tokens"):
        GradCached(MultipleNegativesRankingLoss(tiny_model), mini_batch_size=None)
    with pytest.raises(ValueError, match="mini_batch_num_tokens"):
        GradCached(MultipleNegativesRankingLoss(tiny_model), mini_batch_num_tokens=0)
    with pytest.raises(ValueError, match="compute_loss_from_embeddings"):
        GradCached(nn.Linear(2, 2))
    with pytest.raises(RuntimeError, match="needs mini_batch_size"):
        InfoNCE(tiny_model).cached_forward([], None)
    loss = InfoNCE(tiny_model, mini_batch_size=2, frozen={0: tiny_model, 1: tiny_model})
    with pytest.raises(ValueError, match="every input column is frozen"):
        loss([features(tiny_model, ["a b"]), features(tiny_model, ["c d"])], None)


def test_replay_keeps_the_autocast_of_the_first_pass(tiny_model, tiny_sentences):
    """Step (3) runs inside ``backward()``, outside a ``torch.autocast`` that wrapped only the loss's forward (as a
    hand-written bf16 loop does): the re-embedding replays step (1)'s autocast with its RNG state, so it embeds in
    bf16 exactly what step (1) embedded (bit for bit, dropout on), not a float32 re-embedding."""
    tiny_model.train()
    cols = columns(tiny_model, tiny_sentences, k=2)
    loss = InfoNCE(tiny_model, mini_batch_size=2)
    rec = ForwardRecorder(tiny_model)
    dtypes = []
    layer = tiny_model[0].auto_model.encoder.layer[0].intermediate.dense
    handle = layer.register_forward_hook(lambda m, i, o: dtypes.append((torch.is_grad_enabled(), o.dtype)))
    torch.manual_seed(0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        value = loss(cols, None)
    value.backward()  # outside the autocast, as loops and the Trainer call it
    rec.remove()
    handle.remove()
    assert dtypes == [(False, torch.bfloat16)] * 6 + [(True, torch.bfloat16)] * 6
    first = [emb for _, grad, emb in rec.records if not grad]
    replay = [emb for _, grad, emb in rec.records if grad]
    assert len(first) == len(replay) == 6
    for a, b in zip(first, replay, strict=True):
        assert torch.equal(a, b)
    # and the gradients are the uncached step's under the same autocast (bf16 rounding apart)
    tiny_model.eval()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        full = InfoNCE(tiny_model)(cols, None)
    tiny_model.zero_grad(set_to_none=True)
    full.backward()
    full_grads = {n: p.grad.clone() for n, p in tiny_model.named_parameters() if p.grad is not None}
    tiny_model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cached = InfoNCE(tiny_model, mini_batch_size=2)(cols, None)
    cached.backward()
    cached_grads = {n: p.grad.clone() for n, p in tiny_model.named_parameters() if p.grad is not None}
    assert cached.item() == pytest.approx(full.item(), rel=1e-2)
    assert cached_grads.keys() == full_grads.keys() and len(full_grads) > 10
    diff = torch.cat([(cached_grads[n] - g).flatten() for n, g in full_grads.items()]).norm()
    norm = torch.cat([g.flatten() for g in full_grads.values()]).norm()
    assert diff <= 2e-2 * norm  # measured 0.9 % (1.6 % before the replay: a float32 re-embedding)
