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
