"""The st-hardneg retrieval recipe: the loss and training configuration chosen by the two-dataset BEIR benchmark
(``benchmarks.retrieval_beir_round2``, SciFact + NFCorpus, on the pooled dev tasks).

- :data:`RETRIEVAL_RECIPE`: what the recipe is (loss, options, known relevance, guide, how its negatives are mined,
  training values).
- :func:`retrieval_recipe`: the loss and a :class:`~st_hardneg.training.loop.TrainConfig`, for
  :func:`~st_hardneg.training.loop.train`.
- :func:`recipe_loss`: the loss alone, for a ``SentenceTransformerTrainer`` of your own (``st-hardneg train --task
  beir --loss recipe`` builds it so).
- :func:`check_recipe_overrides`: the overrides of the recipe's loss options, checked before any model is built.
- :data:`FALSE_NEGATIVE_CONTROL` and :func:`controlled_loss`: the recipe's false-negative control (guide, relative
  margin, known positives) for any of st-hardneg's losses; :func:`check_control` checks such a request first.

>>> from st_hardneg.training.recipe import RETRIEVAL_RECIPE
>>> RETRIEVAL_RECIPE["loss"], RETRIEVAL_RECIPE["loss_kwargs"]["margin_strategy"], RETRIEVAL_RECIPE["guide"]
('adcse', 'relative', 'untrained')
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from st_hardneg.training.protocol import train_config

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer
    from torch import nn

    from st_hardneg.training.loop import TrainConfig

__all__ = ["CONTROL_EXTRA", "FALSE_NEGATIVE_CONTROL", "RETRIEVAL_RECIPE", "check_control", "check_recipe_overrides",
           "control_kwargs", "controlled_loss", "recipe_loss", "retrieval_recipe"]

#: the st-hardneg retrieval recipe: the choice of the second retrieval round (``benchmarks.retrieval_beir_round2``,
#: ``results/retrieval_beir_round2.json``), made on the pooled dev tasks of SciFact and NFCorpus among the four
#: losses (Focal-InfoNCE, MixCSE, HNCSE's PM and HNM, AdCSE with tied keys), each with and without the
#: false-negative control (:data:`FALSE_NEGATIVE_CONTROL`), its options chosen among the same small grid and ties
#: closer than two dev standard deviations settled on 3 seeds: AdCSE with tied keys (the document side has gradient;
#: its 64 learned negative adversaries, trained by gradient ascent, join the in-batch and mined negatives) at
#: temperature 0.01 with the control: the relative 0.05 false-negative margin judged by a guide, the model as given,
#: frozen, and the known relevant documents as ``known_positives``; trained on (query, positive, mined negative) rows
#: whose negative is the untrained model's hardest candidate of the whole corpus outside the query's known relevant
#: documents (``mining``: the top 1, no margin, ``known_as_positives``; for ``mined_beir_triplets(..., mining=...)``)
RETRIEVAL_RECIPE: dict[str, Any] = {"loss": "adcse",
                                    "loss_kwargs": {"untied": False, "temperature": 0.01, "margin": 0.05,
                                                    "margin_strategy": "relative"},
                                    "known_positives": True, "guide": "untrained",
                                    "mining": {"num_candidates": 1, "relative_margin": None, "range_min": 0,
                                               "range_max": None, "known_as_positives": True},
                                    "batch_size": 32, "learning_rate": 2e-5, "warmup_ratio": 0.1, "epochs": 1}

#: the recipe's false-negative control, for any of st-hardneg's losses (``st-hardneg train --task beir --control``;
#: the ``+ctl`` rows of ``benchmarks/retrieval_beir_round2``): a relative 0.05 margin (a candidate scored above 95 %
#: of the positive is not a negative: NV-Retriever's TopK-PercPos) judged by a guide, the model as given, frozen
#: (GISTEmbedLoss's rule), and the known relevant documents (e.g. the training qrels) as ``known_positives``
FALSE_NEGATIVE_CONTROL: dict[str, Any] = {"margin": 0.05, "margin_strategy": "relative", "guide": "untrained",
                                          "known_positives": True}
#: what the control needs besides, per loss: ``mixcse_two_way`` normalises each direction on its own
#: (``partition_mode="per_direction"``), which cannot hold the anchor-anchor / positive-positive blocks that a guide
#: turns on by default
CONTROL_EXTRA: dict[str, dict[str, Any]] = {"mixcse_two_way": {"contrast_anchors": False, "contrast_positives": False}}


def check_control(name: str, overrides: dict[str, Any], option: str = "loss_overrides") -> None:
    """Refuse, before any model is built, the false-negative control (:func:`controlled_loss`) for a loss that cannot
    take it (sentence-transformers' own losses take no guide or known positives), an override of what the control
    sets itself (``guide``, ``known_positives``), or a keyword the loss does not accept. ``option`` names the
    overrides in the message (``--loss-arg`` on the command line).

    Raises:
        ValueError: naming the loss or the keyword.
    """
    from st_hardneg.training.registry import check_loss_args, loss_argument_names

    if not {"guide", "known_positives"} <= set(loss_argument_names(name)):
        raise ValueError(f"the false-negative control needs a loss that takes a guide and known positives; {name!r} "
                         "is sentence-transformers' own loss, which takes neither: use mnrl_queue (st-hardneg's "
                         "InfoNCE, the same loss with mnrl's options) or one of the paper losses")
    fixed = sorted(set(overrides) & {"known_positives", "guide"})
    if fixed:
        raise ValueError(f"{option}: the false-negative control sets {' and '.join(fixed)} itself (known_positives: "
                         "the known relevant documents given, e.g. the training qrels; guide: the model as given, "
                         "frozen); drop it")
    check_loss_args(name, overrides, option)


def control_kwargs(name: str, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The options the false-negative control gives loss ``name`` besides its guide and known positives
    (:data:`FALSE_NEGATIVE_CONTROL`'s margin, :data:`CONTROL_EXTRA`), with ``overrides`` on top."""
    return {**{key: FALSE_NEGATIVE_CONTROL[key] for key in ("margin", "margin_strategy")},
            **CONTROL_EXTRA.get(name, {}), **(overrides or {})}


def _frozen_guide(model: SentenceTransformer) -> Any:
    """GIST's guide: the model as given, frozen, in eval mode (no dropout: it scores as the untrained model does)."""
    from st_hardneg.losses.momentum import frozen_copy

    return frozen_copy(model).eval()


def controlled_loss(name: str, model: SentenceTransformer, known_relevant: dict[str, set[str]] | None = None,
                    **loss_overrides: Any) -> nn.Module:
    """Loss ``name`` of :data:`~st_hardneg.training.registry.LOSSES` with the recipe's false-negative control
    (:data:`FALSE_NEGATIVE_CONTROL`): a frozen copy of ``model`` as given guides a relative 0.05 margin, and
    ``known_relevant`` are its known positives. The second retrieval round measures each loss with and without it
    (``benchmarks/results/retrieval_beir_round2.md``).

    Args:
        name: a loss of the registry that takes a guide and known positives (st-hardneg's losses; not
            sentence-transformers' ``mnrl``, ``mnrl_symmetric``, ``mnrl_hardness``).
        model: the SentenceTransformer to fine-tune, before any training step (the guide is a copy of it).
        known_relevant: query text → texts of its known relevant documents (e.g. a BEIR split's
            ``known_paraphrases``, or :func:`st_hardneg.data.relevance.known_positives_from_qrels`); ``None``: no
            known relevance (the guide and the margin only).
        loss_overrides: loss keyword arguments, on top of the control's (e.g. ``margin=None`` for GISTEmbedLoss's
            margin 0, ``temperature=0.01``).

    Returns:
        The loss, guided by a frozen copy of ``model``.

    Raises:
        ValueError: a loss that cannot take the control, ``guide`` or ``known_positives`` among ``loss_overrides``,
            or a keyword the loss does not take (:func:`check_control`).

    Example:
        ::

            from st_hardneg.training.protocol import beir_split
            from st_hardneg.training.recipe import controlled_loss

            data, split = beir_split("path/to/nfcorpus")
            loss = controlled_loss("focal", model, split.known_paraphrases)   # Focal-InfoNCE + the control
    """
    from st_hardneg.training.registry import build_loss

    check_control(name, loss_overrides)
    kwargs = control_kwargs(name, loss_overrides)
    if known_relevant is not None:
        kwargs["known_positives"] = known_relevant
    return build_loss(name, model, guide=_frozen_guide(model), **kwargs)


def check_recipe_overrides(overrides: dict[str, Any], option: str = "loss_overrides") -> None:
    """Refuse, before any model is built, an override of the recipe's loss that it cannot take: a keyword its loss
    does not accept, a value its loss refuses, ``model``, or one it sets itself (``known_positives``: the known
    relevant documents given; ``guide``: :data:`RETRIEVAL_RECIPE`'s). ``option`` names the overrides in the message
    (``--loss-arg`` on the command line).

    Raises:
        ValueError: naming the keyword, or what the loss refused of its value.
    """
    from st_hardneg.training.registry import check_loss_args, check_loss_values

    fixed = sorted(set(overrides) & {"known_positives", "guide"})
    if fixed:
        raise ValueError(f"{option}: the recipe sets {' and '.join(fixed)} itself (known_positives: the known relevant "
                         "documents given, e.g. the training qrels; guide: RETRIEVAL_RECIPE['guide']); drop it")
    check_loss_args(RETRIEVAL_RECIPE["loss"], overrides, option)
    # and the values, by the loss's own checks, with the recipe's options they join (e.g. num_adversaries=-1)
    check_loss_values(RETRIEVAL_RECIPE["loss"], {**RETRIEVAL_RECIPE["loss_kwargs"], **overrides}, option)


def recipe_loss(model: SentenceTransformer, known_relevant: dict[str, set[str]] | None = None,
                **loss_overrides: Any) -> nn.Module:
    """The loss of :data:`RETRIEVAL_RECIPE` for ``model`` (the loss half of :func:`retrieval_recipe`, for a
    ``SentenceTransformerTrainer`` of your own).

    Args:
        model: the SentenceTransformer to fine-tune.
        known_relevant: query text → texts of its known relevant documents (e.g. a BEIR split's
            ``known_paraphrases``, or :func:`st_hardneg.data.relevance.known_positives_from_qrels`): the loss's
            ``known_positives``, so no such document is ever a negative of that query. ``None``: no masking beyond
            the loss's duplicate masking and margin.
        loss_overrides: loss keyword arguments that replace the recipe's, e.g. ``margin=None`` for a model that does
            not yet separate relevant from irrelevant documents (a random encoder scores every candidate within 5 %
            of the positive, so the relative margin would mask them all); with the recipe's guide, no margin is
            GISTEmbedLoss's margin 0 (a candidate the guide scores above the positive is still masked).

    Returns:
        The loss (:class:`~st_hardneg.losses.adcse.AdversarialNegativesLoss`: AdCSE with tied keys and its 64
        learned negative adversaries), guided by a frozen copy of ``model`` as given when :data:`RETRIEVAL_RECIPE`'s
        ``guide`` is ``"untrained"`` (so pass the model before any training step). In a
        ``SentenceTransformerTrainer`` of your own the adversaries take their ascent step after each optimizer step
        (a torch optimizer step post-hook, :mod:`st_hardneg.losses.stateful`); nothing needs adding.

    Raises:
        ValueError: ``known_positives`` or ``guide`` among ``loss_overrides`` (give ``known_relevant``; the guide is
            :data:`RETRIEVAL_RECIPE`'s), a keyword the loss does not take, or an unknown
            ``RETRIEVAL_RECIPE['guide']``.

    Example:
        ::

            from st_hardneg.training.recipe import RETRIEVAL_RECIPE, recipe_loss
            from st_hardneg.training.protocol import beir_split, mined_beir_triplets

            data, split = beir_split("path/to/scifact")
            triplets, _ = mined_beir_triplets(data, split, mining=RETRIEVAL_RECIPE["mining"])
            loss = recipe_loss(model, split.known_paraphrases)
            SentenceTransformerTrainer(model=model, args=args, train_dataset=triplets, loss=loss).train()
    """
    from st_hardneg.training.registry import build_loss

    check_recipe_overrides(loss_overrides)
    kwargs = {**RETRIEVAL_RECIPE["loss_kwargs"], **loss_overrides}
    if known_relevant is not None and RETRIEVAL_RECIPE["known_positives"]:
        kwargs["known_positives"] = known_relevant
    if RETRIEVAL_RECIPE["guide"] not in (None, "untrained"):
        raise ValueError(f"RETRIEVAL_RECIPE['guide'] must be None or 'untrained' (a frozen copy of the model as given), "
                         f"got {RETRIEVAL_RECIPE['guide']!r}")
    if RETRIEVAL_RECIPE["guide"] == "untrained":  # GIST's guide: the model as given, frozen, before any step
        kwargs["guide"] = _frozen_guide(model)
    return build_loss(RETRIEVAL_RECIPE["loss"], model, **kwargs)


def retrieval_recipe(model: SentenceTransformer, known_relevant: dict[str, set[str]] | None,
                     output_dir: str | Path = "output/retrieval-recipe", *, seed: int = 0,
                     loss_overrides: dict[str, Any] | None = None,
                     **config_overrides: Any) -> tuple[Any, TrainConfig]:
    """The st-hardneg retrieval recipe in one line: the loss and the training configuration of
    :data:`RETRIEVAL_RECIPE` for ``model``.

    Args:
        model: the SentenceTransformer to fine-tune (e.g. :func:`~st_hardneg.training.protocol.load_recipe_model`).
        known_relevant: query text → texts of its known relevant documents (e.g. a BEIR split's
            ``known_paraphrases``, or :func:`st_hardneg.data.relevance.known_positives_from_qrels`): the loss's
            ``known_positives``, so no such document is ever a negative of that query. ``None``: no masking beyond
            the loss's duplicate masking.
        output_dir: the Trainer's output folder.
        seed: the training seed (also the data order).
        loss_overrides: loss keyword arguments that replace the recipe's (see :func:`recipe_loss`).
        config_overrides: any :class:`~st_hardneg.training.loop.TrainConfig` field.

    Returns:
        ``(loss, config)`` for :func:`st_hardneg.training.loop.train`.

    Raises:
        ValueError: a bad loss override (:func:`recipe_loss`) or training value (:class:`~st_hardneg.training.loop.TrainConfig`).

    Example:
        ::

            from st_hardneg.training.loop import train
            from st_hardneg.training.recipe import RETRIEVAL_RECIPE, retrieval_recipe
            from st_hardneg.training.protocol import beir_split, load_recipe_model, mined_beir_triplets

            data, split = beir_split("path/to/scifact")
            triplets, _ = mined_beir_triplets(data, split, mining=RETRIEVAL_RECIPE["mining"])  # the recipe's negatives
            model = load_recipe_model()
            loss, config = retrieval_recipe(model, split.known_paraphrases, "out/scifact")
            train(model, triplets, loss, config)
    """
    overrides = dict(loss_overrides or {})
    check_recipe_overrides(overrides)  # model= among them is refused here, not by Python's call
    loss = recipe_loss(model, known_relevant, **overrides)
    values = {key: RETRIEVAL_RECIPE[key] for key in ("batch_size", "learning_rate", "warmup_ratio", "epochs")}
    config = train_config(output_dir, seed=seed, **{**values, **config_overrides})
    return loss, config
