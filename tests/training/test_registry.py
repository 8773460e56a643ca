"""``st_hardneg.training.registry``: the class call shown for each loss builds exactly the registry's loss, and the
documentation links."""

from __future__ import annotations

import importlib

import pytest

from st_hardneg.training.registry import (
    DOCS_URL,
    LOSSES,
    MIXCSE_TWO_WAY,
    PLAIN_LOSSES,
    _loss_class,
    build_loss,
    loss_call,
    loss_docs_url,
)

CASES = [(name, {}) for name in sorted(LOSSES)] + [
    ("mixcse", {"lam": 0.3}), ("mixcse", {"directions": ("query_to_doc",)}), ("focal", {"queue_size": 8}),
    ("mnrl", {"temperature": 0.1}), ("mnrl_queue", {"queue_size": 16}), ("hncse_hnm", {"k": 8}),
]


@pytest.mark.parametrize("name, kwargs", CASES, ids=[f"{n}-{k}" for n, k in CASES])
def test_the_shown_call_builds_the_registry_loss(tiny_model, name, kwargs):
    cls = _loss_class(name)
    call = loss_call(name, kwargs)
    assert call.startswith(f"{cls.__name__}(model")
    built_from_call = eval(call, {cls.__name__: cls, "model": tiny_model})  # noqa: S307 - our own rendering
    expected = build_loss(name, tiny_model, **kwargs)
    assert type(built_from_call) is type(expected)
    assert built_from_call.get_config_dict() == expected.get_config_dict()


def test_mixcse_shows_its_two_way_form():
    assert MIXCSE_TWO_WAY == {"directions": ("query_to_doc", "doc_to_query"), "partition_mode": "per_direction"}
    # the two-direction form has its own name; the plain name is the class's default
    assert loss_call("mixcse_two_way") == ("MixCSELoss(model, directions=('query_to_doc', 'doc_to_query'), "
                                           "partition_mode='per_direction')")
    assert loss_call("mixcse") == "MixCSELoss(model)"
    assert loss_call("hncse") == "HNCSELoss(model)" and loss_call("hncse_both") == "HNCSELoss(model, mode='both')"
    assert loss_call("focal") == "FocalInfoNCELoss(model)"
    assert loss_call("hncse_pm", {"k": 5}) == "HNCSELoss(model, mode='pm', k=5)"
    with pytest.raises(ValueError, match="unknown loss"):
        loss_call("simcse++")


@pytest.mark.parametrize("name", PLAIN_LOSSES)
def test_every_plain_name_is_its_class_default(tiny_model, name):
    """One name, one loss: ``--loss NAME`` for a plain name equals ``ClassName(model)``, option for option."""
    cls = _loss_class(name)
    built = build_loss(name, tiny_model)
    assert type(built) is cls
    assert built.get_config_dict() == cls(tiny_model).get_config_dict()


def test_the_named_forms_fix_what_their_names_say(tiny_model):
    from st_hardneg.losses.mixcse import MixCSELoss

    two_way = build_loss("mixcse_two_way", tiny_model).get_config_dict()
    assert two_way == MixCSELoss(tiny_model, **MIXCSE_TWO_WAY).get_config_dict()
    assert two_way != build_loss("mixcse", tiny_model).get_config_dict()
    modes = {name: build_loss(name, tiny_model).mode for name in ("hncse", "hncse_pm", "hncse_hnm", "hncse_both")}
    assert modes == {"hncse": "pm", "hncse_pm": "pm", "hncse_hnm": "hnm", "hncse_both": "both"}


def test_the_old_name_of_the_two_way_form_warns_and_is_the_same_form():
    from st_hardneg.training import registry

    with pytest.warns(DeprecationWarning, match="MIXCSE_BENCHMARK_FORM is deprecated; use MIXCSE_TWO_WAY"):
        old = registry.MIXCSE_BENCHMARK_FORM
    assert old == MIXCSE_TWO_WAY
    with pytest.raises(AttributeError, match="no attribute 'NO_SUCH_NAME'"):
        registry.NO_SUCH_NAME  # noqa: B018 - the attribute access is the test


def test_docs_links_of_the_st_hardneg_losses_only():
    pages = {}
    for module, cls in [("st_hardneg.losses.mixcse", "MixCSELoss"), ("st_hardneg.losses.focal", "FocalInfoNCELoss"),
                        ("st_hardneg.losses.hncse", "HNCSELoss"), ("st_hardneg.losses.adcse", "AdversarialNegativesLoss")]:
        pages[cls] = loss_docs_url(getattr(importlib.import_module(module), cls))
    assert pages == {"MixCSELoss": f"{DOCS_URL}/losses/mixcse.html", "FocalInfoNCELoss": f"{DOCS_URL}/losses/focal.html",
                     "HNCSELoss": f"{DOCS_URL}/losses/hncse.html", "AdversarialNegativesLoss": f"{DOCS_URL}/losses/adcse.html"}
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    assert loss_docs_url(MultipleNegativesRankingLoss) is None


@pytest.mark.parametrize("options", [
    {"queue_size": 8}, {"queue_size": 6, "queue_warmup_steps": 1, "temperature": 0.1},
    {"queue_size": 8, "queue_anchors": True, "directions": ("query_to_doc", "doc_to_query")},
])
def test_mnrl_queue_is_the_base_with_the_numbers_of_the_adcse_reduction(options):
    """``mnrl_queue`` builds the concrete base, whose loss and gradients equal those of the AdCSE reduction it was
    built as before (no adversaries, tied keys, no duplicate masking) to 1e-6, batch by batch while the queue fills
    and is read."""
    import torch
    from torch import nn

    from st_hardneg import AdversarialNegativesLoss
    from st_hardneg.losses.base import HardNegativeLoss

    model = nn.Linear(4, 4)
    ours = build_loss("mnrl_queue", model, **options)
    assert type(ours) is HardNegativeLoss and _loss_class("mnrl_queue") is HardNegativeLoss
    reduction = AdversarialNegativesLoss(model, num_adversaries=0, untied=False, mask_duplicates=False, **options)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    generator = torch.Generator().manual_seed(0)
    read = 0.0
    for _ in range(4):
        columns = [torch.randn(4, 4, generator=generator) for _ in range(3)]  # anchors, positives, a hard negative
        results = []
        for loss in (ours, reduction):
            leaves = [column.clone().requires_grad_(True) for column in columns]
            value = loss.compute_loss_from_embeddings(leaves, None)
            value.backward()
            results.append((value.detach(), [leaf.grad for leaf in leaves]))
        (got, got_grads), (want, want_grads) = results
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
        for mine, theirs in zip(got_grads, want_grads, strict=True):
            torch.testing.assert_close(mine, theirs, rtol=1e-6, atol=1e-6)
        read = max(read, float(ours.diagnostics.get("queue_rows_read", 0.0)))
        model.weight.grad = torch.zeros_like(model.weight)
        optimizer.step()  # commits the staged rows of both losses' queues
    assert read > 0  # the queue was read, not only filled
    assert ours.queue.filled == reduction.queue.filled == options["queue_size"]
