"""The shared options as one checked value (``loss.options``, a :class:`SharedOptions`): the same messages as the
loss's keywords, and its warnings point at the user's line. Each option declared once (its field: default, check,
documentation), the signature, the attributes, the config and the typed keywords made from or held to it. The queue's
options as one checked value: the flat ``queue_*`` keywords, the one spelling; the deprecated
``queue=QueueOptions(...)`` warns naming them and is the same loss (the same config, the same numbers), never both."""

from __future__ import annotations

import dataclasses
import inspect
import warnings

import pytest
import torch
from torch import nn

from st_hardneg import AdversarialNegativesLoss, FocalInfoNCELoss, HardNegativeLoss, HNCSELoss, MixCSELoss
from st_hardneg.losses.options import LossOptions, QueueOptions, SharedOptions, loss_keywords
from tests.losses.test_queue import _batch, _step


def _message(make) -> tuple[type[BaseException], str]:
    with pytest.raises((ValueError, TypeError)) as info:
        make()
    return info.type, str(info.value)


@pytest.mark.parametrize("fields, fragment", [
    ({"size": -1}, "queue_size must be a non-negative integer, got -1"),
    ({"size": 2.5}, "queue_size must be a non-negative integer, got 2.5"),
    ({"size": 4, "warmup_steps": -1}, "queue_warmup_steps must be a non-negative integer, got -1"),
    ({"size": 4, "max_age": 0}, "queue_max_age must be a positive integer or None, got 0"),
    ({"size": 4, "checkpoint": "yes"}, "queue_checkpoint must be True or False, got 'yes'"),
    ({"size": 4, "source": "momentum"}, "queue_source must be one of 'online', 'ema'; got 'momentum'"),
    ({"size": 4, "source": "ema", "momentum": 1.5}, "queue_momentum"),
    ({"source": "ema"}, "queue_source / queue_momentum set without a queue; set queue_size > 0"),
    ({"momentum": 0.9}, "queue_source / queue_momentum set without a queue; set queue_size > 0"),
    ({"anchors": True}, "queue_anchors=True without a queue; set queue_size > 0"),
    ({"size": 4, "anchors": "yes"}, "queue_anchors must be True or False, got 'yes'"),
    ({"as_pool": True}, "queue_as_pool=True without a queue; set queue_size > 0"),
    ({"size": 4, "as_pool": "yes"}, "queue_as_pool must be True or False, got 'yes'"),
])
def test_queue_options_are_checked_with_the_flat_keywords_messages(fields, fragment):
    """QueueOptions refuses what the flat keywords refuse, with the same message (a rule between the options names
    its owner: QueueOptions made by hand, the loss when its keywords made them)."""
    error, message = _message(lambda: QueueOptions(**fields))
    assert fragment in message
    flat = {f"queue_{name}": value for name, value in fields.items()}
    flat_error, flat_message = _message(lambda: FocalInfoNCELoss(nn.Linear(4, 4), **flat))
    assert (flat_error, flat_message.replace("FocalInfoNCELoss: ", "QueueOptions: ", 1)) == (error, message)
    grouped_error, grouped_message = _message(lambda: FocalInfoNCELoss(nn.Linear(4, 4), queue=QueueOptions(**fields)))
    assert (grouped_error, grouped_message) == (error, message)  # raised as the options are made


def test_queue_options_are_frozen_and_hold_the_checked_values():
    options = QueueOptions(size=8, max_age=3, source="ema", momentum=0.9)
    assert (options.size, options.warmup_steps, options.max_age, options.checkpoint, options.source,
            options.momentum, options.anchors, options.as_pool) == (8, 0, 3, True, "ema", 0.9, False, False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.size = 16  # type: ignore[misc]
    assert QueueOptions() == QueueOptions(size=0) and not QueueOptions().size


@pytest.mark.parametrize("make, flat, grouped", [
    (lambda model, **kw: FocalInfoNCELoss(model, temperature=0.05, **kw),
     {"queue_size": 8, "queue_max_age": 3, "queue_checkpoint": False},
     QueueOptions(size=8, max_age=3, checkpoint=False)),
    (lambda model, **kw: MixCSELoss(model, partner="hardest", seed=0, **kw),
     {"queue_size": 8, "queue_as_pool": True}, QueueOptions(size=8, as_pool=True)),
    (lambda model, **kw: FocalInfoNCELoss(model, directions=("query_to_doc", "doc_to_query"), **kw),
     {"queue_size": 6, "queue_anchors": True}, QueueOptions(size=6, anchors=True)),
    (lambda model, **kw: MixCSELoss(model, seed=0, **kw), {"queue_size": 8}, 8),  # queue=<size>
])
def test_queue_options_are_the_flat_keywords(make, flat, grouped):
    """A loss built with queue=QueueOptions(...) (or queue=<size>) is the loss built with the flat keywords: the
    same config dict and the same loss, to 1e-6, over two steps of which the second reads the queue."""
    model = nn.Linear(4, 4)
    by_keywords, by_options = make(model, **flat), make(model, queue=grouped)
    assert by_options.get_config_dict() == by_keywords.get_config_dict()
    assert by_options.queue_options == by_keywords.queue_options
    assert by_keywords.get_config_dict()["queue_size"] == flat["queue_size"]
    for step in range(2):
        embeddings = _batch(step, n=4)
        expected = by_keywords.compute_loss_from_embeddings(embeddings, None)
        got = by_options.compute_loss_from_embeddings(embeddings, None)
        torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)
        _step(model)
    assert by_options.diagnostics["queue_rows_read"] == by_keywords.diagnostics["queue_rows_read"] > 0


@pytest.mark.parametrize("flat", [{"queue_size": 8}, {"queue_size": 0}, {"queue_warmup_steps": 2},
                                  {"queue_max_age": None}])
def test_queue_and_a_flat_queue_keyword_together_are_refused(flat):
    """Either queue=... or the flat keywords, also when the flat one is given its default value."""
    (key, value), = flat.items()
    with pytest.raises(TypeError, match=f"queue=QueueOptions.*and {key}={value!r}"):
        FocalInfoNCELoss(nn.Linear(4, 4), queue=QueueOptions(size=8), **flat)
    with pytest.raises(TypeError, match=f"not both; got queue=8 and {key}="):
        MixCSELoss(nn.Linear(4, 4), queue=8, **flat)


def test_queue_takes_options_or_a_size_only():
    with pytest.raises(TypeError, match="queue must be a QueueOptions or an int"):
        FocalInfoNCELoss(nn.Linear(4, 4), queue={"size": 8})
    with pytest.raises(ValueError, match="queue_size must be a non-negative integer, got True"):
        FocalInfoNCELoss(nn.Linear(4, 4), queue=True)
    assert FocalInfoNCELoss(nn.Linear(4, 4), queue=None).queue is None  # no queue, as the default
    assert FocalInfoNCELoss(nn.Linear(4, 4), queue=QueueOptions()).get_config_dict() == (
        FocalInfoNCELoss(nn.Linear(4, 4)).get_config_dict())


def test_the_flat_keywords_show_their_defaults():
    """The flat keywords' defaults read as before in the signature (help, docs, the CLI's argument list)."""
    parameters = inspect.signature(HardNegativeLoss.__init__).parameters
    shown = {name: repr(parameters[name].default) for name in parameters if name.startswith("queue_")}
    defaults = {f"queue_{field.name}": repr(field.default) for field in dataclasses.fields(QueueOptions)}
    assert shown == defaults
    assert parameters["queue"].default is None


# ------------------------------------------------------------------------------------------------ shared options
@pytest.mark.parametrize("fields, fragment", [
    ({"similarity_fct": torch.nn.functional.cosine_similarity}, "similarity_fct must be"),
    ({"temperature": 0.0}, "temperature must be a positive, finite number, got 0.0"),
    ({"temperature": "warm"}, "temperature must be a positive, finite number, got 'warm'"),
    ({"temperature": 1e-40}, "temperature=1e-40 is too small"),
    ({"directions": "query_to_doc"}, "directions must be a tuple"),
    ({"directions": ("doc_to_query",)}, "must include 'query_to_doc'"),
    ({"directions": ("query_to_doc", "query_to_doc")}, "must not repeat"),
    ({"directions": ("query_to_doc", "sideways")}, "directions must be a non-empty tuple"),
    ({"partition_mode": "both"}, "partition_mode must be one of 'joint', 'per_direction'; got 'both'"),
    ({"directions": ("query_to_doc", "doc_to_doc"), "partition_mode": "per_direction"},
     "partition_mode='per_direction' needs every direction to contain the positive pair"),
    ({"hardness_mode": "hardest"}, "hardness_mode must be one of"),
    ({"hardness_strength": -1.0}, "hardness_strength must be a finite number >= 0, got -1.0"),
    ({"seed": -1}, "seed must be a non-negative integer, got -1"),
    ({"seed": 1.5}, "seed must be a non-negative integer, got 1.5"),
    ({"mask_duplicates": "no"}, "mask_duplicates must be True or False, got 'no'"),
    ({"margin": -0.1}, "margin must be a finite number >= 0, got -0.1"),
    ({"margin_strategy": "both"}, "margin_strategy must be one of 'absolute', 'relative'; got 'both'"),
    ({"contrast_anchors": 1}, "contrast_anchors must be True or False, got 1"),
    ({"contrast_positives": "yes"}, "contrast_positives must be True or False, got 'yes'"),
    ({"contrast_anchors": True, "partition_mode": "per_direction"},
     "SharedOptions: contrast_anchors / contrast_positives add same-type blocks without the positive pair"),
    ({"contrast_positives": True, "partition_mode": "per_direction"},
     "SharedOptions: contrast_anchors / contrast_positives add same-type blocks without the positive pair"),
    ({"contrast_anchors": True, "directions": ("query_to_doc", "query_to_query")},
     "SharedOptions: contrast_anchors=True and directions with 'query_to_query' would contrast the anchors twice"),
    ({"gather_across_devices": "yes"}, "gather_across_devices must be True or False, got 'yes'"),
    ({"mini_batch_size": 0}, "mini_batch_size must be a positive integer or None, got 0"),
    ({"mini_batch_num_tokens": 2.5}, "mini_batch_num_tokens must be a positive integer or None, got 2.5"),
    ({"show_progress_bar": "yes"}, "show_progress_bar must be True or False, got 'yes'"),
    ({"queue": -1}, "queue_size must be a non-negative integer, got -1"),
    ({"queue": {"size": 8}}, "queue must be a QueueOptions or an int"),
])
def test_shared_options_are_checked_with_the_loss_keywords_messages(fields, fragment):
    """SharedOptions refuses what a loss's keywords refuse, with the same message (a rule between the options names
    its owner: SharedOptions made by hand, the loss when its keywords made them)."""
    error, message = _message(lambda: SharedOptions(**fields))
    assert fragment in message
    for loss in (FocalInfoNCELoss, MixCSELoss):
        loss_error, loss_message = _message(lambda loss=loss: loss(nn.Linear(4, 4), **fields))
        shown = loss_message.replace(f"{loss.__name__}: ", "SharedOptions: ", 1)
        assert (loss_error, shown) == (error, message)
        built_error, built_message = _message(lambda loss=loss: SharedOptions.from_keywords(loss.__name__, **fields))
        assert (built_error, built_message) == (loss_error, loss_message)


@pytest.mark.parametrize("keywords, fragment", [
    ({"scale": 20.0, "temperature": 0.05}, "give either scale (sentence-transformers' name, = 1/temperature) or "
                                           "temperature, not both"),
    ({"scale": 0.0}, "scale (= 1/temperature) must be a positive, finite number, got 0.0"),
    ({"scale": "big"}, "scale (= 1/temperature) must be a finite number, got 'big'"),
    ({"temperature": -1.0}, "temperature must be a positive, finite number, got -1.0"),
    ({"queue": 8, "queue_size": 8}, "MixCSELoss: give the queue either as queue=... or as the flat queue_* "
                                    "keywords, not both"),
    ({"queue_source": "ema"}, "MixCSELoss: queue_source / queue_momentum set without a queue"),
])
def test_from_keywords_resolves_scale_temperature_and_the_queue_aliases_as_the_loss(keywords, fragment):
    error, message = _message(lambda: SharedOptions.from_keywords("MixCSELoss", **keywords))
    assert fragment in message
    assert _message(lambda: MixCSELoss(nn.Linear(4, 4), **keywords)) == (error, message)


def _build(loss, model, **keywords):
    """The loss of ``model`` with ``keywords`` (AdCSE without adversaries, which need the embedding dimension)."""
    return loss(model, **({"num_adversaries": 0} if loss is AdversarialNegativesLoss else {}), **keywords)


@pytest.mark.parametrize("make, keywords", [
    (MixCSELoss, {}),
    (MixCSELoss, {"scale": 50.0, "margin": 0.1, "margin_strategy": "relative", "seed": 3, "queue": 16}),
    (FocalInfoNCELoss, {"temperature": 0.1, "directions": ("query_to_doc", "doc_to_query"),
                        "partition_mode": "per_direction", "hardness_mode": "hard_negatives",
                        "hardness_strength": 5.0, "mask_duplicates": False}),
    (FocalInfoNCELoss, {"contrast_anchors": True, "contrast_positives": True, "gather_across_devices": True,
                        "queue_size": 8, "queue_warmup_steps": 2, "queue_max_age": 4, "queue_checkpoint": False}),
    (HNCSELoss, {"mini_batch_size": 4, "show_progress_bar": True, "similarity_fct": "cos_sim"}),
    (AdversarialNegativesLoss, {"mini_batch_num_tokens": 64, "seed": 0,
                                "queue": QueueOptions(size=8, source="ema")}),
])
def test_the_loss_options_are_shared_options_from_the_same_keywords(make, keywords):
    """loss.options is SharedOptions.from_keywords(...) of the same keywords, and the loss's attributes of the same
    names (and its config) read its values."""
    loss = _build(make, nn.Linear(4, 4), **keywords)
    options = SharedOptions.from_keywords(make.__name__, **keywords)
    assert loss.options == options and dataclasses.replace(options) == options
    assert (loss.temperature, loss.scale) == (options.temperature, options.scale)
    assert loss.similarity_fct_name == options.similarity_fct
    for name in ("directions", "partition_mode", "hardness_mode", "hardness_strength", "seed", "mask_duplicates",
                 "margin", "margin_strategy", "contrast_anchors", "contrast_positives", "gather_across_devices",
                 "mini_batch_size", "mini_batch_num_tokens", "show_progress_bar"):
        assert getattr(loss, name) == getattr(options, name), name
    assert loss.queue_options == options.queue
    config = loss.get_config_dict()
    assert all(config[name] == getattr(options, name) for name in ("temperature", "margin", "directions", "seed"))


def test_shared_options_hold_canonical_values_and_are_frozen():
    from sentence_transformers import util

    options = SharedOptions(similarity_fct=util.dot_score, directions=["query_to_doc", "doc_to_query"], queue=8)
    assert options.similarity_fct == "dot_score" and options.directions == ("query_to_doc", "doc_to_query")
    assert options.queue == QueueOptions(size=8) and options.scale == pytest.approx(20.0)
    assert SharedOptions() == SharedOptions.from_keywords("MixCSELoss") == SharedOptions(queue=None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.margin = 0.1  # type: ignore[misc]
    # a guide (GISTEmbedLoss(model, guide)): margin 0 and both contrast blocks, unless given
    guided = SharedOptions(guided=True)
    assert (guided.margin, guided.contrast_anchors, guided.contrast_positives) == (0.0, True, True)
    guided = SharedOptions(guided=True, margin=0.2, contrast_anchors=False)
    assert (guided.margin, guided.contrast_anchors, guided.contrast_positives) == (0.2, False, True)
    # known_positives is kept as given (the loss checks and tokenises it), out of the repr and the hash
    relevant = SharedOptions(known_positives={"q": {"d"}})
    assert relevant.known_positives == {"q": {"d"}} and "known_positives" not in repr(relevant)
    assert hash(relevant) == hash(SharedOptions())


class _SubclassedLoss(MixCSELoss):
    """A user's loss one constructor deeper than the library's."""

    def __init__(self, model, **options):
        super().__init__(model, **options)


def _warnings_of(make) -> list[warnings.WarningMessage]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make()
    return [w for w in caught if issubclass(w.category, UserWarning)]


@pytest.mark.parametrize("loss", [MixCSELoss, FocalInfoNCELoss, HNCSELoss, AdversarialNegativesLoss, _SubclassedLoss])
@pytest.mark.parametrize("keywords, fragment", [
    ({"temperature": 20.0}, "temperature=20.0 means a temperature of 20"),
    ({"scale": 0.5}, "scale=0.5 means a temperature of 2"),
    ({"hardness_mode": "in_batch_negatives"}, "hardness_strength=0.0"),
    ({"known_positives": {}}, "known_positives is empty"),
])
def test_the_options_warnings_point_at_the_line_that_built_the_loss(loss, keywords, fragment):
    """The checks run inside SharedOptions (a few calls below the loss's constructor): their warnings still name the
    user's file and line, whatever the depth of the library's calls (a subclass's constructor is the user's)."""
    extra = {"num_adversaries": 0} if loss is AdversarialNegativesLoss else {}
    line = inspect.currentframe().f_lineno + 1
    caught = _warnings_of(lambda: loss(nn.Linear(4, 4), **extra, **keywords))
    assert len(caught) == 1 and fragment in str(caught[0].message)
    assert (caught[0].filename, caught[0].lineno) == (__file__, line if loss is not _SubclassedLoss else
                                                      inspect.getsourcelines(_SubclassedLoss.__init__)[1] + 1)


def test_warnings_of_options_made_by_hand_and_of_a_clamped_count_point_at_the_caller():
    caught = _warnings_of(lambda: SharedOptions(hardness_mode="hard_negatives"))
    assert len(caught) == 1 and caught[0].filename == __file__
    caught = _warnings_of(lambda: SharedOptions.from_keywords("MixCSELoss", temperature=2.0))
    assert len(caught) == 1 and caught[0].filename == __file__
    caught = _warnings_of(lambda: HNCSELoss(None, mode="hnm", k=2, num_mixed=40))
    assert len(caught) == 1 and "num_mixed=40" in str(caught[0].message) and caught[0].filename == __file__


def test_a_built_loss_refuses_a_new_option_value_with_what_to_do_instead(tiny_model):
    """The queue's options are fixed when the loss is built (its banks hold the queued rows): assigning one says so
    and changes nothing; the options sentence-transformers keeps assignable (the temperature, the margin, the
    GradCache sizes) are applied (tests/losses/test_sentence_transformers_paths.py checks the numbers)."""
    loss = MixCSELoss(tiny_model, temperature=0.05, queue_size=8)
    before = loss.get_config_dict()
    with pytest.raises(AttributeError, match=r"MixCSELoss\.queue_size is fixed when the loss is built.*"
                                             r"build a new loss with queue_size="):
        loss.queue_size = 16
    assert loss.get_config_dict() == before and loss.options.queue.size == 8
    for name, value in (("temperature", 0.1), ("margin", 0.2), ("scale", 10.0)):
        setattr(loss, name, value)
    assert loss.temperature == 0.1 and loss.margin == 0.2 and loss.get_config_dict()["scale"] == 10.0
    loss.mini_batch_size = 4
    assert loss.mini_batch_size == 4 and loss.get_config_dict()["mini_batch_size"] == 4


# ------------------------------------------------------------------------------------------ one declaration each
def test_the_typed_keywords_are_the_declarations():
    """LossOptions, the static TypedDict type checkers read for ``**options``, is the shadow of the declarations:
    the same keywords, in the same order, with the same types (the lines to paste are printed when they differ)."""
    declared = [(name, kind) for name, (kind, _, _) in loss_keywords().items()]
    shadow = [(name, getattr(hint, "__forward_arg__", hint)) for name, hint in LossOptions.__annotations__.items()]
    lines = "\n".join(f"    {name}: {kind}" for name, kind in declared)
    assert shadow == declared, f"LossOptions' fields must read (from loss_keywords()):\n{lines}"


def test_the_signature_attributes_config_and_documentation_follow_the_declarations():
    """Every field of SharedOptions / QueueOptions is a keyword of the signature with its declared default, a
    documented entry of LossOptions with its declared text, an attribute of the loss where declared one (reading
    loss.options), and in get_config_dict where declared so."""
    parameters = inspect.signature(HardNegativeLoss.__init__).parameters
    loss = HardNegativeLoss(nn.Linear(4, 4), margin=0.1, seed=4, queue_size=8, queue_warmup_steps=2)
    config = loss.get_config_dict()
    documented = " ".join(LossOptions.__doc__.split())
    for spec in dataclasses.fields(SharedOptions):
        meta = spec.metadata
        if meta["keyword"] and spec.name != "queue":
            default = meta["keyword_default"] if meta["keyword_type"] else spec.default
            assert parameters[spec.name].default == default, spec.name
            assert f"{spec.name}: {meta['doc']}" in documented, spec.name
        if meta["attribute"]:
            assert getattr(loss, spec.name) == getattr(loss.options, spec.name), spec.name
        assert (spec.name in config) == (meta["config"] and spec.name not in ("known_positives", "queue", "guided"))
    for spec in dataclasses.fields(QueueOptions):
        name = f"queue_{spec.name}"
        assert repr(parameters[name].default) == repr(spec.default)
        assert f"{name}: the queue's ``{spec.name}``: {spec.metadata['doc']}" in documented
        assert getattr(loss, name) == getattr(loss.options.queue, spec.name)
        assert spec.name in " ".join(QueueOptions.__doc__.split())
    assert (config["queue_size"], config["queue_warmup_steps"], config["margin"], config["seed"]) == (8, 2, 0.1, 4)


@pytest.mark.parametrize("queue, flat", [
    (QueueOptions(size=8, warmup_steps=2, source="ema", momentum=0.9),
     {"queue_size": 8, "queue_warmup_steps": 2, "queue_source": "ema", "queue_momentum": 0.9}),
    (8, {"queue_size": 8}),
    (QueueOptions(), {}),
])
def test_the_queue_keyword_is_deprecated_for_the_flat_keywords(queue, flat):
    """queue=QueueOptions(...) / queue=<size> still builds the same loss for one release, with a DeprecationWarning at
    the user's line naming the flat keywords to write instead; the flat keywords do not warn."""
    spelled = ", ".join(f"{key}={value!r}" for key, value in flat.items()) or "no queue_* keyword"
    line = inspect.currentframe().f_lineno + 2
    with pytest.warns(DeprecationWarning, match="queue=.* is deprecated") as caught:
        deprecated = MixCSELoss(nn.Linear(4, 4), seed=0, queue=queue)
    (warning,) = [w for w in caught if issubclass(w.category, DeprecationWarning)]
    assert f"give the flat keywords instead: {spelled}" in str(warning.message)
    assert (warning.filename, warning.lineno) == (__file__, line)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        flat_loss = MixCSELoss(nn.Linear(4, 4), seed=0, **flat)
    assert deprecated.options == flat_loss.options and deprecated.get_config_dict() == flat_loss.get_config_dict()
