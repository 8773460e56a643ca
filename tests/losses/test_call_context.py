"""One call's context (``CallContext``): under GradCache the frozen columns (embedded without gradient by another
module) travel in the call's context with its side inputs, reach every ``calculate_loss`` of the call (one per
dimension inside ``MatryoshkaLoss``), and nothing of them is left on the loss or its parts after the call."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from sentence_transformers.sentence_transformer.losses import MatryoshkaLoss, MultipleNegativesRankingLoss
from torch import Tensor, nn

from st_hardneg import AdversarialNegativesLoss
from st_hardneg.losses.base import HardNegativeLoss
from st_hardneg.losses.gradcache import GradCached


def _held_tensors(root: Any) -> list[Tensor]:
    """Every tensor reachable from ``root`` through instance attributes (modules, their parts, dataclasses) and the
    dicts, lists and tuples they hold."""
    seen: set[int] = set()
    found: list[Tensor] = []
    stack = [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, Tensor):
            found.append(obj)
        elif isinstance(obj, dict):
            stack.extend(obj.values())
        elif isinstance(obj, list | tuple | set | frozenset):
            stack.extend(obj)
        elif isinstance(obj, nn.Module) or dataclasses.is_dataclass(obj) or type(obj).__module__.startswith(
                "st_hardneg"):
            stack.extend(vars(obj).values() if hasattr(obj, "__dict__") else
                         (getattr(obj, f.name) for f in dataclasses.fields(obj)))  # type: ignore[arg-type]
    return found


def _holds(root: Any, columns: list[Tensor]) -> bool:
    """Whether a tensor reachable from ``root`` is one of ``columns`` (or a copy of one, same shape and values)."""
    return any(held is column or (held.shape == column.shape and held.dtype == column.dtype
                                  and held.device == column.device and torch.equal(held, column))
               for held in _held_tensors(root) for column in columns)


def _spy_contexts(monkeypatch: pytest.MonkeyPatch, owner: Any) -> list[tuple[Any, bool]]:
    """Record ``(context, whether the loss holds its frozen columns then)`` of every ``compute`` call."""
    calls: list[tuple[Any, bool]] = []
    compute = HardNegativeLoss.compute

    def spy(self: HardNegativeLoss, *args: Any, **kwargs: Any) -> Tensor:
        context = kwargs.get("context")
        frozen = list(context.frozen_columns.values()) if context is not None else []
        calls.append((context, bool(frozen) and _holds(owner, frozen)))
        return compute(self, *args, **kwargs)

    monkeypatch.setattr(HardNegativeLoss, "compute", spy)
    return calls


def test_a_cached_forward_inside_matryoshka_keeps_no_frozen_column(tiny_model, tiny_sentences, monkeypatch):
    """AdCSE ``untied=True``: the positives are embedded by the key encoder without gradient. Both dimensions of
    ``MatryoshkaLoss`` compute with the call's one context, whose frozen column is the key encoder's embedding of
    the positives; after the forward and its backward no attribute of the loss, its parts or the wrapper holds it
    (while the call ran, the loss held it: the search below finds what is there)."""
    tiny_model.eval()
    anchors, positives = tiny_sentences[:6], tiny_sentences[6:12]
    loss = AdversarialNegativesLoss(tiny_model, num_adversaries=2, untied=True, mini_batch_size=2, seed=0)
    wrapped = MatryoshkaLoss(tiny_model, loss, [32, 16], matryoshka_weights=[1.0, 0.5])
    calls = _spy_contexts(monkeypatch, wrapped)
    features = [dict(tiny_model.tokenize(anchors)), dict(tiny_model.tokenize(positives))]
    value = wrapped(features, None)
    value.backward()

    assert len(calls) == 2  # one compute per dimension
    (first, held_first), (second, held_second) = calls
    assert first is second and held_first and held_second
    assert set(first.frozen_columns) == {1}
    with torch.no_grad():
        keys = loss.key_encoder(dict(tiny_model.tokenize(positives)))["sentence_embedding"]
    torch.testing.assert_close(first.frozen_columns[1], keys, rtol=1e-5, atol=1e-6)
    assert first.side_inputs is not None and first.side_inputs.text_keys is not None  # one context: side inputs too

    frozen = list(first.frozen_columns.values())
    assert not _holds(wrapped, frozen)
    assert not _holds(loss, frozen)
    assert "_call_context" not in vars(loss)
    assert vars(loss.gradcache) == {}  # the GradCache part keeps nothing of any call


def test_a_wrapped_loss_with_frozen_columns_keeps_none_after_the_call(tiny_model, tiny_sentences, monkeypatch):
    """``GradCached`` with a frozen column: the loss equals the one computed from the frozen module's embedding
    (the column reached step (2) through the call's context), and nothing holds the column afterwards."""
    tiny_model.eval()
    key_encoder = MultipleNegativesRankingLoss(tiny_model).model  # the same weights: a column embedded frozen
    loss = GradCached(MultipleNegativesRankingLoss(tiny_model), mini_batch_size=2, frozen_columns={1: key_encoder})
    seen: list[list[Tensor]] = []
    inner = loss.loss.compute_loss_from_embeddings

    def record(embeddings: list[Tensor], labels: Tensor | None) -> Tensor:
        seen.append(list(embeddings))
        return inner(embeddings, labels)

    monkeypatch.setattr(loss.loss, "compute_loss_from_embeddings", record)
    features = [dict(tiny_model.tokenize(tiny_sentences[:6])), dict(tiny_model.tokenize(tiny_sentences[6:12]))]
    value = loss(features, None)
    value.backward()

    (embeddings,) = seen
    with torch.no_grad():
        want = [tiny_model(dict(tiny_model.tokenize(s)))["sentence_embedding"]
                for s in (tiny_sentences[:6], tiny_sentences[6:12])]
    torch.testing.assert_close(embeddings[1], want[1], rtol=1e-5, atol=1e-6)
    assert not embeddings[1].requires_grad and embeddings[0].requires_grad  # frozen vs cached
    similarity = 20.0 * torch.nn.functional.normalize(want[0], dim=-1) @ torch.nn.functional.normalize(
        want[1], dim=-1).T
    expected = torch.nn.functional.cross_entropy(similarity, torch.arange(6))
    torch.testing.assert_close(value.detach(), expected, rtol=1e-5, atol=1e-6)
    assert not _holds(loss, [embeddings[1]])
    assert vars(loss._engine) == {}
