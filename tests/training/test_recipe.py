"""st_hardneg.training.recipe: the one-line retrieval recipe (its configuration and one training step on a tiny BEIR
folder)."""

from __future__ import annotations

import pytest


def test_recipe_configuration(tiny_model, tmp_path):
    """The second round's choice: AdCSE with tied keys, its 64 adversaries, temperature 0.01 and the false-negative
    control (the untrained model guiding the relative 0.05 margin, known positives), on the hardest negative outside
    the known relevant documents."""
    from st_hardneg.losses.adcse import AdversarialNegativesLoss
    from st_hardneg.training.recipe import FALSE_NEGATIVE_CONTROL, RETRIEVAL_RECIPE, retrieval_recipe
    from st_hardneg.training.sampling import KnownRelevanceBatchSampler, known_relevance_sampler

    known = {"a query": {"a document", "another document"}}
    loss, config = retrieval_recipe(tiny_model, known, tmp_path / "out", seed=3)
    assert type(loss) is AdversarialNegativesLoss and loss.model is tiny_model
    config_dict = loss.get_config_dict()
    assert (config_dict["num_adversaries"], config_dict["untied"], config_dict["in_batch_keys"]) == (64, False, True)
    assert loss.adversary_bank.weight.shape == (64, tiny_model.get_embedding_dimension())
    assert loss.temperature == 0.01 and (loss.margin, loss.margin_strategy) == (0.05, "relative")
    assert {"margin": loss.margin, "margin_strategy": loss.margin_strategy, "guide": RETRIEVAL_RECIPE["guide"],
            "known_positives": RETRIEVAL_RECIPE["known_positives"]} == FALSE_NEGATIVE_CONTROL  # the control, all of it
    assert config_dict["known_positives"] == 2 and loss.mask_duplicates
    assert loss.guide is not None and loss.guide is not tiny_model and not loss.guide.training
    assert not any(p.requires_grad for p in loss.guide.parameters())
    # the round's negatives for st-hardneg's rows: the untrained model's hardest document outside the known relevant
    assert RETRIEVAL_RECIPE["mining"] == {"num_candidates": 1, "relative_margin": None, "range_min": 0,
                                          "range_max": None, "known_as_positives": True}
    assert (config.batch_size, config.learning_rate, config.warmup_ratio, config.epochs, config.seed) == (
        32, 2e-5, 0.1, 1, 3)
    assert RETRIEVAL_RECIPE["loss"] == "adcse" and "batch_sampler" not in config.extra_args
    plain, small = retrieval_recipe(tiny_model, None, tmp_path / "out", batch_size=8)
    assert plain.known_positives is None and plain.guide is not None and small.batch_size == 8
    # the batch-side alternative stays available for any loss (e.g. sentence-transformers' own)
    sampler = known_relevance_sampler(known)
    assert sampler.func is KnownRelevanceBatchSampler and sampler.keywords == {"known_relevant": known}


def test_recipe_trains_one_step_on_a_tiny_beir_folder(tiny_model, tmp_path):
    import torch
    from datasets import Dataset

    from st_hardneg.data.beir import beir_retrieval
    from st_hardneg.testing.beir import make_tiny_beir
    from st_hardneg.testing.fixtures import parameter_snapshot, parameters_changed
    from st_hardneg.training.loop import train
    from st_hardneg.training.recipe import retrieval_recipe

    split = beir_retrieval(make_tiny_beir(tmp_path / "beir", docs_per_topic=6, train_queries=40), dev_fraction=0.2)
    corpus = split.train_corpus
    rows = {"anchor": [], "positive": [], "negative": []}
    for i, (anchor, positive) in enumerate(split.train_pairs):  # a different negative per row
        negative = next(d for d in corpus[i:] + corpus[:i] if d not in split.known_paraphrases[anchor])
        rows["anchor"].append(anchor)
        rows["positive"].append(positive)
        rows["negative"].append(negative)
    before = parameter_snapshot(tiny_model)
    # a random encoder (and so its frozen copy, the guide) scores every candidate within 5 % of the positive: the
    # margin would mask them all, so it is off here (the documented override for a model that does not yet separate)
    loss, config = retrieval_recipe(tiny_model, split.known_paraphrases, tmp_path / "out", batch_size=2, max_steps=1,
                                    warmup_ratio=0.0, show_progress_bar=False, loss_overrides={"margin": None})
    adversaries = loss.adversary_bank.weight.clone()
    result = train(tiny_model, Dataset.from_dict(rows), loss, config)
    assert result.steps == 1
    assert parameters_changed(tiny_model, before)
    # the adversaries took their ascent step after the optimizer's (no callback needed)
    assert loss.adversary_bank.updates == 1 and not torch.equal(loss.adversary_bank.weight, adversaries)


def test_recipe_refuses_a_bad_override(tiny_model, tmp_path):
    from st_hardneg.training.recipe import retrieval_recipe

    with pytest.raises(ValueError, match="batch_size"):
        retrieval_recipe(tiny_model, None, tmp_path / "out", batch_size=0)


def test_a_guided_recipe_guides_with_a_frozen_copy_of_the_model_as_given(tiny_model, tmp_path, monkeypatch):
    import torch

    from st_hardneg.training import recipe

    monkeypatch.setitem(recipe.RETRIEVAL_RECIPE, "guide", "untrained")
    loss, _ = recipe.retrieval_recipe(tiny_model, None, tmp_path / "out")
    assert loss.guide is not None and loss.guide is not tiny_model and not loss.guide.training
    assert not any(p.requires_grad for p in loss.guide.parameters())
    assert all(p.requires_grad for p in tiny_model.parameters())
    for mine, theirs in zip(tiny_model.parameters(), loss.guide.parameters(), strict=True):
        assert torch.equal(mine, theirs) and mine.data_ptr() != theirs.data_ptr()


def test_an_unknown_recipe_guide_is_refused(tiny_model, tmp_path, monkeypatch):
    from st_hardneg.training import recipe

    monkeypatch.setitem(recipe.RETRIEVAL_RECIPE, "guide", "trained")
    with pytest.raises(ValueError, match="RETRIEVAL_RECIPE\\['guide'\\] must be None or 'untrained'.*'trained'"):
        recipe.retrieval_recipe(tiny_model, None, tmp_path / "out")


def test_recipe_loss_is_the_recipes_loss_and_takes_overrides(tiny_model, tmp_path):
    """The second round's recipe: ``recipe_loss`` is ``retrieval_recipe``'s loss; an override replaces that option
    only (here the adversaries' number, and the margin)."""
    from st_hardneg.training.recipe import recipe_loss, retrieval_recipe

    known = {"a query": {"a document"}}
    loss = recipe_loss(tiny_model, known)
    same, _ = retrieval_recipe(tiny_model, known, tmp_path / "out")
    assert loss.get_config_dict() == same.get_config_dict()
    fewer = recipe_loss(tiny_model, known, num_adversaries=16)
    fewer_too, _ = retrieval_recipe(tiny_model, known, tmp_path / "out", loss_overrides={"num_adversaries": 16})
    for other in (fewer, fewer_too):
        changed = {k for k in loss.get_config_dict() if loss.get_config_dict()[k] != other.get_config_dict()[k]}
        assert changed == {"num_adversaries"} and other.adversary_bank.weight.shape[0] == 16
    loose = recipe_loss(tiny_model, known, margin=None)
    assert loose.margin == 0.0 and loose.guide is not None and loose.known_positives is not None


@pytest.mark.parametrize(("overrides", "message"), [
    ({"known_positives": {}}, r"loss_overrides: the recipe sets known_positives itself \(known_positives: "
                              r"the known relevant documents given"),
    ({"guide": None, "known_positives": {}}, "the recipe sets guide and known_positives itself"),
    ({"lam": 0.2}, "loss_overrides: loss 'adcse' takes no argument lam; it takes"),
    ({"num_adversaries": -1}, "num_adversaries"),
    ({"adversary_lr": float("nan")}, "adversary_lr"),
])
def test_recipe_loss_refuses_a_bad_override(tiny_model, tmp_path, overrides, message):
    from st_hardneg.training import recipe

    with pytest.raises(ValueError, match=message):
        recipe.recipe_loss(tiny_model, None, **overrides)
    with pytest.raises(ValueError, match=message):
        recipe.retrieval_recipe(tiny_model, None, tmp_path / "out", loss_overrides=overrides)


def test_the_model_is_no_loss_override(tiny_model, tmp_path):
    from st_hardneg.training.recipe import retrieval_recipe

    with pytest.raises(ValueError, match="loss_overrides model=...: the model is not a loss argument"):
        retrieval_recipe(tiny_model, None, tmp_path / "out", loss_overrides={"model": tiny_model})


@pytest.mark.parametrize(("overrides", "message"), [
    ({"margin": -0.1}, "margin must be a finite number >= 0, got -0.1"),
    ({"margin": float("nan")}, "margin must be a finite number >= 0, got nan"),
    ({"margin_strategy": "sideways"}, "margin_strategy must be one of 'absolute', 'relative'; got 'sideways'"),
])
def test_a_bad_override_value_is_the_losss_own_error(tiny_model, overrides, message):
    """An override the loss takes but with a bad value fails as the loss's own check, never a NaN loss later."""
    from st_hardneg.training.recipe import recipe_loss

    with pytest.raises(ValueError, match=message):
        recipe_loss(tiny_model, None, **overrides)


@pytest.mark.parametrize("name", ["focal", "mixcse", "mixcse_two_way", "hncse_hnm", "hncse_pm", "adcse", "mnrl_queue"])
def test_the_false_negative_control_for_any_of_st_hardnegs_losses(tiny_model, name):
    from st_hardneg.training.recipe import FALSE_NEGATIVE_CONTROL, controlled_loss
    from st_hardneg.training.registry import build_loss

    known = {"a query": {"a document", "another document"}}
    loss = controlled_loss(name, tiny_model, known, temperature=0.02)
    # the relative 0.05 margin, judged by a frozen copy of the model as given, and the known relevant documents
    assert (loss.margin, loss.margin_strategy, loss.temperature) == (0.05, "relative", 0.02)
    assert FALSE_NEGATIVE_CONTROL == {"margin": 0.05, "margin_strategy": "relative", "guide": "untrained",
                                      "known_positives": True}
    assert loss.guide is not None and loss.guide is not tiny_model and not loss.guide.training
    assert not any(p.requires_grad for p in loss.guide.parameters())
    assert loss.get_config_dict()["known_positives"] == 2
    # the same loss built by hand with those options
    extra = {"contrast_anchors": False, "contrast_positives": False} if name == "mixcse_two_way" else {}
    by_hand = build_loss(name, tiny_model, guide=loss.guide, margin=0.05, margin_strategy="relative",
                         known_positives=known, temperature=0.02, **extra)
    assert by_hand.get_config_dict() == loss.get_config_dict()
    # an option of the control replaced; without known relevance, the guide and the margin only
    assert controlled_loss(name, tiny_model, None, margin=0.1).margin == 0.1
    assert controlled_loss(name, tiny_model, None).known_positives is None


@pytest.mark.parametrize(("name", "overrides", "fragment"), [
    ("mnrl", {}, "'mnrl' is sentence-transformers' own loss, which takes neither: use mnrl_queue"),
    ("mnrl_hardness", {}, "'mnrl_hardness' is sentence-transformers' own loss"),
    ("focal", {"guide": None}, "the false-negative control sets guide itself"),
    ("focal", {"known_positives": {}}, "the false-negative control sets known_positives itself"),
    ("focal", {"margn": 0.1}, "takes no argument margn (did you mean margin?)"),
])
def test_the_control_is_refused_where_it_cannot_apply(tiny_model, name, overrides, fragment):
    from st_hardneg.training.recipe import check_control, controlled_loss

    with pytest.raises(ValueError, match=None) as caught:
        controlled_loss(name, tiny_model, None, **overrides)
    assert fragment in str(caught.value)
    with pytest.raises(ValueError):
        check_control(name, overrides)
