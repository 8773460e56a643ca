"""The st-hardneg retrieval recipe: the loss and training configuration chosen by the two-dataset BEIR benchmark
(``benchmarks.retrieval_beir``, SciFact + NFCorpus, on the pooled dev tasks).

- :data:`RETRIEVAL_RECIPE`: what the recipe is (loss, options, known relevance, guide, training values).
- :func:`retrieval_recipe`: the loss and a :class:`~st_hardneg.training.loop.TrainConfig`, for
  :func:`~st_hardneg.training.loop.train`.
- :func:`recipe_loss`: the loss alone, for a ``SentenceTransformerTrainer`` of your own (``st-hardneg train --task
  beir --loss recipe`` builds it so).
- :func:`check_recipe_overrides`: the overrides of the recipe's loss options, checked before any model is built.

>>> from st_hardneg.training.recipe import RETRIEVAL_RECIPE
>>> RETRIEVAL_RECIPE["loss"], RETRIEVAL_RECIPE["loss_kwargs"]["margin_strategy"]
('mnrl_queue', 'relative')
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from st_hardneg.training.retrieval import train_config

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer
    from torch import nn

    from st_hardneg.training.loop import TrainConfig

__all__ = ["RETRIEVAL_RECIPE", "check_recipe_overrides", "recipe_loss", "retrieval_recipe"]

#: the st-hardneg retrieval recipe of ``benchmarks.retrieval_beir`` (chosen there on the pooled dev tasks of SciFact
#: and NFCorpus among Focal-InfoNCE, InfoNCE, InfoNCE with the margin and HNCSE's mixup, each with known relevance):
#: sentence-transformers' ``MultipleNegativesRankingLoss`` equation (registry name ``mnrl_queue``: st-hardneg's
#: InfoNCE, no queue unless asked) with st-hardneg's false-negative controls: duplicate masking, the relative margin
#: (a candidate scoring above 95 % of the positive's similarity, judged by the trained model, is not a negative:
#: NV-Retriever's TopK-PercPos applied in the loss, so a mined negative that is an unjudged relevant document is
#: dropped) and known-relevance masking (``known_positives``: an in-batch candidate the training qrels mark relevant
#: to a row's query leaves that row's denominator), trained on (query, positive, mined negative) rows
RETRIEVAL_RECIPE: dict[str, Any] = {"loss": "mnrl_queue",
                                    "loss_kwargs": {"mask_duplicates": True, "margin": 0.05,
                                                    "margin_strategy": "relative"},
                                    "known_positives": True, "guide": None, "batch_size": 32, "learning_rate": 2e-5,
                                    "warmup_ratio": 0.1, "epochs": 1}


def check_recipe_overrides(overrides: dict[str, Any], option: str = "loss_overrides") -> None:
    """Refuse, before any model is built, an override of the recipe's loss that it cannot take: a keyword its loss
    does not accept, ``model``, or one it sets itself (``known_positives``: the known relevant documents given;
    ``guide``: :data:`RETRIEVAL_RECIPE`'s). ``option`` names the overrides in the message (``--loss-arg`` on the
    command line).

    Raises:
        ValueError: naming the keyword.
    """
    from st_hardneg.training.registry import check_loss_args

    fixed = sorted(set(overrides) & {"known_positives", "guide"})
    if fixed:
        raise ValueError(f"{option}: the recipe sets {' and '.join(fixed)} itself (known_positives: the known relevant "
                         "documents given, e.g. the training qrels; guide: RETRIEVAL_RECIPE['guide']); drop it")
    check_loss_args(RETRIEVAL_RECIPE["loss"], overrides, option)


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
            of the positive, so the relative margin would mask them all).

    Returns:
        The loss (st-hardneg's InfoNCE, :class:`~st_hardneg.losses.adcse.AdversarialNegativesLoss` without
        adversaries).

    Raises:
        ValueError: ``known_positives`` or ``guide`` among ``loss_overrides`` (give ``known_relevant``; the guide is
            :data:`RETRIEVAL_RECIPE`'s), a keyword the loss does not take, or an unknown
            ``RETRIEVAL_RECIPE['guide']``.

    Example:
        ::

            from st_hardneg.training.recipe import recipe_loss

            loss = recipe_loss(model, split.known_paraphrases)
            SentenceTransformerTrainer(model=model, args=args, train_dataset=triplets, loss=loss).train()
    """
    from st_hardneg.losses.momentum import frozen_copy
    from st_hardneg.training.registry import build_loss

    check_recipe_overrides(loss_overrides)
    kwargs = {**RETRIEVAL_RECIPE["loss_kwargs"], **loss_overrides}
    if known_relevant is not None and RETRIEVAL_RECIPE["known_positives"]:
        kwargs["known_positives"] = known_relevant
    if RETRIEVAL_RECIPE["guide"] not in (None, "untrained"):
        raise ValueError(f"RETRIEVAL_RECIPE['guide'] must be None or 'untrained' (a frozen copy of the model as given), "
                         f"got {RETRIEVAL_RECIPE['guide']!r}")
    if RETRIEVAL_RECIPE["guide"] == "untrained":  # GIST's guide: the model as given, frozen, before any step
        kwargs["guide"] = frozen_copy(model).eval()  # no dropout: the guide scores as the untrained model does
    return build_loss(RETRIEVAL_RECIPE["loss"], model, **kwargs)


def retrieval_recipe(model: SentenceTransformer, known_relevant: dict[str, set[str]] | None,
                     output_dir: str | Path = "output/retrieval-recipe", *, seed: int = 0,
                     loss_overrides: dict[str, Any] | None = None,
                     **config_overrides: Any) -> tuple[Any, TrainConfig]:
    """The st-hardneg retrieval recipe in one line: the loss and the training configuration of
    :data:`RETRIEVAL_RECIPE` for ``model``.

    Args:
        model: the SentenceTransformer to fine-tune (e.g. :func:`~st_hardneg.training.retrieval.load_recipe_model`).
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
            from st_hardneg.training.recipe import retrieval_recipe
            from st_hardneg.training.retrieval import beir_split, load_recipe_model

            data, split = beir_split("path/to/scifact")
            model = load_recipe_model()
            loss, config = retrieval_recipe(model, split.known_paraphrases, "out/scifact")
            train(model, triplets, loss, config)   # triplets: anchor, positive, negative (e.g. mined_beir_triplets)
    """
    overrides = dict(loss_overrides or {})
    check_recipe_overrides(overrides)  # model= among them is refused here, not by Python's call
    loss = recipe_loss(model, known_relevant, **overrides)
    values = {key: RETRIEVAL_RECIPE[key] for key in ("batch_size", "learning_rate", "warmup_ratio", "epochs")}
    config = train_config(output_dir, seed=seed, **{**values, **config_overrides})
    return loss, config
