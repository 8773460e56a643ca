"""The training objectives by name: ``LOSSES`` maps a method name to a factory ``factory(model, **hyperparameters)``,
and :func:`parse_loss_args` reads their hyperparameters from ``KEY=VALUE`` strings (``--loss-arg``, variants).

This module imports neither torch nor sentence-transformers (each factory imports its loss when called), so the
command line can list the names without loading them.

>>> from st_hardneg.training import LOSSES, build_loss, parse_loss_args
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer
    from torch import nn

    from st_hardneg.losses.hncse import Mode


def _mnrl(model: SentenceTransformer, **kwargs: Any) -> nn.Module:
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    temperature = kwargs.pop("temperature", 0.05)
    return MultipleNegativesRankingLoss(model, scale=1.0 / float(temperature), **kwargs)


def _mnrl_symmetric(model: SentenceTransformer, **kwargs: Any) -> nn.Module:
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesSymmetricRankingLoss

    temperature = kwargs.pop("temperature", 0.05)
    return MultipleNegativesSymmetricRankingLoss(model, scale=1.0 / float(temperature), **kwargs)


def _mnrl_hardness(model: SentenceTransformer, **kwargs: Any) -> nn.Module:
    kwargs.setdefault("hardness_mode", "in_batch_negatives")
    kwargs.setdefault("hardness_strength", 9.0)  # Lan et al. 2025's alpha, as in ST's docstring
    return _mnrl(model, **kwargs)


#: the form of MixCSE every committed benchmark ran (st-hardneg 0.1's default): both directions, each with its mixed
#: negative (the released code's blocks 1-3); ``MixCSELoss(model)`` itself is the paper's Eq. 2 (one direction)
MIXCSE_BENCHMARK_FORM = {"directions": ("query_to_doc", "doc_to_query"), "partition_mode": "per_direction"}


def _mixcse(model: SentenceTransformer, **kwargs: Any) -> nn.Module:
    from st_hardneg.losses.mixcse import MixCSELoss

    if "directions" not in kwargs and kwargs.get("layout", "paper") == "paper":
        kwargs = {**MIXCSE_BENCHMARK_FORM, **kwargs}
    return MixCSELoss(model, **kwargs)


def _focal(model: SentenceTransformer, **kwargs: Any) -> nn.Module:
    from st_hardneg.losses.focal import FocalInfoNCELoss

    return FocalInfoNCELoss(model, **kwargs)


def _hncse(mode: Mode) -> Callable:
    def build(model: SentenceTransformer, **kwargs: Any) -> nn.Module:
        from st_hardneg.losses.hncse import HNCSELoss

        return HNCSELoss(model, mode=mode, **kwargs)

    return build


def _adcse(model: SentenceTransformer, **kwargs: Any) -> nn.Module:
    from st_hardneg.losses.adcse import AdversarialNegativesLoss

    return AdversarialNegativesLoss(model, **kwargs)


#: method name → factory(model, **hyperparameters); every factory's defaults are its paper's (MixCSE: the two-directional
#: form the benchmarks ran, :data:`MIXCSE_BENCHMARK_FORM`)
LOSSES: dict[str, Callable] = {
    "mnrl": _mnrl,
    "mnrl_symmetric": _mnrl_symmetric,
    "mnrl_hardness": _mnrl_hardness,
    "mixcse": _mixcse,
    "focal": _focal,
    "hncse_pm": _hncse("pm"),
    "hncse_hnm": _hncse("hnm"),
    "hncse": _hncse("both"),
    "adcse": _adcse,
}


def build_loss(name: str, model: SentenceTransformer, **kwargs: Any) -> nn.Module:
    """The loss called ``name`` (see :data:`LOSSES`) for ``model``, with hyperparameters ``kwargs``."""
    if name not in LOSSES:
        raise ValueError(f"unknown loss {name!r}; choose from {', '.join(LOSSES)}")
    try:
        return LOSSES[name](model, **kwargs)
    except TypeError as exc:  # an unknown keyword: say which loss rejected it
        raise ValueError(f"loss {name!r} rejected its arguments {kwargs}: {exc}") from exc


def parse_loss_args(items: list[str] | None, option: str = "--loss-arg") -> dict[str, Any]:
    """``["lam=0.3", "partner=random", "focal_m=None"]`` → ``{"lam": 0.3, "partner": "random", "focal_m": None}``
    (``option`` names the command-line option in the error message)."""
    result: dict[str, Any] = {}
    for item in items or []:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{option} expects KEY=VALUE, got {item!r}")
        raw = raw.strip()
        if raw.lower() in ("true", "false"):
            value: Any = raw.lower() == "true"
        elif raw.lower() in ("none", "null"):
            value = None
        else:
            try:
                value = ast.literal_eval(raw)
            except (ValueError, SyntaxError):
                value = raw
        result[key.strip().replace("-", "_")] = value
    return result
