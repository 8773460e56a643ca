"""The queue's options as one checked value (``queue=QueueOptions(...)``): the same messages as the flat
``queue_*`` keywords, which stay as aliases (the same loss, the same config, the same numbers), and never both."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
import torch
from torch import nn

from st_hardneg import FocalInfoNCELoss, HardNegativeLoss, MixCSELoss
from st_hardneg.losses.options import QueueOptions


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


def _step(model):
    """One optimizer step of the loss's model (what commits the staged rows)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    model.weight.grad = torch.zeros_like(model.weight)
    optimizer.step()


def _batch(seed, n=4, d=4):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, d, generator=g), torch.randn(n, d, generator=g)]


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
        embeddings = _batch(step)
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
