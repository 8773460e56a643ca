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


def _scale(kwargs: dict[str, Any]) -> float:
    """sentence-transformers' ``scale`` from the factories' ``temperature`` (popped from ``kwargs``), checked."""
    import math

    temperature = kwargs.pop("temperature", 0.05)
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not math.isfinite(temperature) \
            or temperature <= 0:
        raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}")
    return 1.0 / float(temperature)


def _mnrl(model: SentenceTransformer, **kwargs: Any) -> nn.Module:
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    scale = _scale(kwargs)
    return MultipleNegativesRankingLoss(model, scale=scale, **kwargs)


def _mnrl_symmetric(model: SentenceTransformer, **kwargs: Any) -> nn.Module:
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesSymmetricRankingLoss

    scale = _scale(kwargs)
    return MultipleNegativesSymmetricRankingLoss(model, scale=scale, **kwargs)


def _mnrl_hardness(model: SentenceTransformer, **kwargs: Any) -> nn.Module:
    kwargs.setdefault("hardness_mode", "in_batch_negatives")
    kwargs.setdefault("hardness_strength", 9.0)  # Lan et al. 2025's alpha, as in ST's docstring
    return _mnrl(model, **kwargs)


#: MixCSE's two-direction form, ``--loss mixcse_two_way``: both directions, each with its mixed negative and
#: normalised on its own (the released code's blocks 1-3); ``--loss mixcse`` is ``MixCSELoss(model)`` itself, the
#: paper's Eq. 2 (one direction)
MIXCSE_TWO_WAY = {"directions": ("query_to_doc", "doc_to_query"), "partition_mode": "per_direction"}


def __getattr__(name: str) -> Any:
    """``MIXCSE_BENCHMARK_FORM``, 0.2's name of :data:`MIXCSE_TWO_WAY`: the same form, with a deprecation warning."""
    if name == "MIXCSE_BENCHMARK_FORM":
        import warnings

        warnings.warn("st_hardneg.training.registry.MIXCSE_BENCHMARK_FORM is deprecated; use MIXCSE_TWO_WAY (the same "
                      "form)", DeprecationWarning, stacklevel=2)
        return MIXCSE_TWO_WAY
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _mixcse(model: SentenceTransformer, **kwargs: Any) -> nn.Module:
    from st_hardneg.losses.mixcse import MixCSELoss

    return MixCSELoss(model, **kwargs)


def _mixcse_two_way(model: SentenceTransformer, **kwargs: Any) -> nn.Module:
    from st_hardneg.losses.mixcse import MixCSELoss

    if "directions" not in kwargs and kwargs.get("layout", "paper") == "paper":
        kwargs = {**MIXCSE_TWO_WAY, **kwargs}
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


def _mnrl_queue(model: SentenceTransformer, **kwargs: Any) -> nn.Module:
    """sentence-transformers' ``MultipleNegativesRankingLoss`` with st-hardneg's cross-batch queue: the concrete base
    :class:`~st_hardneg.losses.base.HardNegativeLoss` (InfoNCE over sentence-transformers' blocks, no paper columns)
    without duplicate masking is exactly MNRL (tests/losses/test_base_infonce.py), and takes ``queue_size``; the
    baseline a queued loss is compared with."""
    from st_hardneg.losses.base import HardNegativeLoss

    kwargs = {"mask_duplicates": False, **kwargs}
    return HardNegativeLoss(model, **kwargs)


#: method name → ``factory(model, **hyperparameters)``. One name, one loss: a plain name (``mixcse``, ``focal``,
#: ``hncse``, ``adcse``) builds its class's default configuration, ``ClassName(model)``; the named forms say what they
#: fix (``hncse_pm`` / ``hncse_hnm`` / ``hncse_both``: ``mode``; ``mixcse_two_way``: :data:`MIXCSE_TWO_WAY`, both
#: directions)
LOSSES: dict[str, Callable] = {
    "mnrl": _mnrl,
    "mnrl_symmetric": _mnrl_symmetric,
    "mnrl_hardness": _mnrl_hardness,
    "mnrl_queue": _mnrl_queue,
    "mixcse": _mixcse,
    "mixcse_two_way": _mixcse_two_way,
    "focal": _focal,
    "hncse": _hncse("pm"),  # HNCSELoss(model): its default mode, fixed as the named forms fix theirs
    "hncse_pm": _hncse("pm"),
    "hncse_hnm": _hncse("hnm"),
    "hncse_both": _hncse("both"),
    "adcse": _adcse,
}
#: the plain names: each builds exactly its class's default configuration (``tests`` hold them to it)
PLAIN_LOSSES = ("mixcse", "focal", "hncse", "adcse")


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
    (``option`` names the command-line option in the error message).

    Raises:
        ValueError: an item without ``=`` or a key, or a key given twice (which value was meant is unknowable).
    """
    result: dict[str, Any] = {}
    for item in items or []:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{option} expects KEY=VALUE, got {item!r}")
        name = key.strip().replace("-", "_")
        if name in result:
            raise ValueError(f"{option} gives {name} twice ({name}={result[name]!r} and {item!r}); give it once")
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


#: keyword arguments of each factory beyond its loss class's own (the MNRL factories take a temperature)
_FACTORY_EXTRAS: dict[str, tuple[str, ...]] = {"mnrl": ("temperature",), "mnrl_symmetric": ("temperature",),
                                               "mnrl_hardness": ("temperature",)}
#: arguments a factory sets itself, never taken from the caller
_FACTORY_FIXED: dict[str, tuple[str, ...]] = {"hncse": ("mode",), "hncse_pm": ("mode",), "hncse_hnm": ("mode",),
                                               "hncse_both": ("mode",)}


def _loss_class(name: str) -> type:
    from importlib import import_module

    module, cls = {
        "mnrl": ("sentence_transformers.sentence_transformer.losses", "MultipleNegativesRankingLoss"),
        "mnrl_symmetric": ("sentence_transformers.sentence_transformer.losses",
                           "MultipleNegativesSymmetricRankingLoss"),
        "mnrl_hardness": ("sentence_transformers.sentence_transformer.losses", "MultipleNegativesRankingLoss"),
        "mnrl_queue": ("st_hardneg.losses.base", "HardNegativeLoss"),
        "mixcse": ("st_hardneg.losses.mixcse", "MixCSELoss"), "mixcse_two_way": ("st_hardneg.losses.mixcse", "MixCSELoss"),
        "focal": ("st_hardneg.losses.focal", "FocalInfoNCELoss"),
        "hncse_pm": ("st_hardneg.losses.hncse", "HNCSELoss"), "hncse_hnm": ("st_hardneg.losses.hncse", "HNCSELoss"),
        "hncse": ("st_hardneg.losses.hncse", "HNCSELoss"), "hncse_both": ("st_hardneg.losses.hncse", "HNCSELoss"),
        "adcse": ("st_hardneg.losses.adcse", "AdversarialNegativesLoss"),
    }[name]
    return getattr(import_module(module), cls)  # type: ignore[no-any-return]


def loss_argument_names(name: str) -> tuple[str, ...]:
    """The keyword arguments the loss ``name`` of :data:`LOSSES` accepts (its class's, without ``model``)."""
    import inspect

    if name not in LOSSES:
        raise ValueError(f"unknown loss {name!r}; choose from {', '.join(LOSSES)}")
    names: list[str] = []
    for cls in _loss_class(name).__mro__:  # a class passing **kwargs on takes its bases' arguments too
        if "__init__" not in vars(cls) or cls is object:
            continue
        parameters = inspect.signature(vars(cls)["__init__"]).parameters.values()
        names += [p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
                  and p.name not in ("self", "model", *_FACTORY_FIXED.get(name, ()))]
        if not any(p.kind is p.VAR_KEYWORD for p in parameters):
            break
    if name.startswith("mnrl"):  # the factories take a temperature in place of scale
        names = [n for n in names if n != "scale"]
    return tuple(sorted({*names, *_FACTORY_EXTRAS.get(name, ())}))


def check_loss_args(name: str, kwargs: dict[str, Any], option: str = "--loss-arg") -> None:
    """Refuse, before any model is loaded, a keyword the loss ``name`` does not take, and ``model`` (the model is
    chosen by ``--model``); the values are checked when the loss is built.

    Raises:
        ValueError: naming the keyword and listing the accepted ones.
    """
    if "model" in kwargs:
        raise ValueError(f"{option} model=...: the model is not a loss argument; choose it with --model")
    accepted = loss_argument_names(name)
    unknown = sorted(set(kwargs) - set(accepted))
    if unknown:
        import difflib

        hints = [f"{u} (did you mean {close[0]}?)" if (close := difflib.get_close_matches(u, accepted, 1)) else u
                 for u in unknown]
        raise ValueError(f"{option}: loss {name!r} takes no argument {', '.join(hints)}; it takes "
                         f"{', '.join(accepted)}")


def check_loss_values(name: str, kwargs: dict[str, Any], option: str = "--loss-arg") -> None:
    """Run the loss's own checks of its arguments' values without a model (``model=None``, the functional path),
    so that a bad value (``lam=3``, ``k=0``, ``temperature=0``) is a usage error before any model loads. A check that
    needs the model (its embedding dimension, GradCache's encoder) is left to the build.

    Raises:
        ValueError: what the loss refused, prefixed with ``option`` and the loss's name.
    """
    if name not in LOSSES:
        raise ValueError(f"unknown loss {name!r}; choose from {', '.join(LOSSES)}")
    try:
        LOSSES[name](None, **kwargs)
    except (ValueError, TypeError, ArithmeticError) as exc:
        message = " ".join(str(exc).split())
        if "model" in message or "NoneType" in message:  # needs the model itself: checked when it is built
            return
        raise ValueError(f"{option}: loss {name!r}: {message}") from None
    except AttributeError:  # the loss reads the model while it is built: checked then
        return


def package_version() -> str:
    """``st_hardneg.__version__``, read from the package object, which Python always loads before any of its
    modules (so no module below the package face imports the face for it)."""
    import sys

    return str(sys.modules["st_hardneg"].__version__)


#: the documentation site (built from ``docs/``); every link to it is made from this constant
DOCS_URL = "https://st-hardneg.readthedocs.io/en/latest"
#: the documentation page of each st-hardneg loss class, ``{DOCS_URL}/losses/{page}.html``
LOSS_DOC_PAGES = {"MixCSELoss": "mixcse", "FocalInfoNCELoss": "focal", "HNCSELoss": "hncse",
                  "AdversarialNegativesLoss": "adcse"}


def loss_docs_url(loss: Any) -> str | None:
    """The documentation page of ``loss`` (an instance or a class) when it is an st-hardneg loss, else ``None``."""
    cls = loss if isinstance(loss, type) else type(loss)
    page = LOSS_DOC_PAGES.get(cls.__name__)
    return f"{DOCS_URL}/losses/{page}.html" if page and cls.__module__.startswith("st_hardneg.") else None


def loss_call(name: str, kwargs: dict[str, Any] | None = None) -> str:
    """The class call that builds the loss ``name`` of :data:`LOSSES` with ``kwargs``, as code: the factory's own
    settings (e.g. MixCSE's :data:`MIXCSE_TWO_WAY`) written out, so the row of any table is reproduced from
    the class alone.

    Example:
        ::

            >>> loss_call("mixcse_two_way", {"lam": 0.3})
            "MixCSELoss(model, directions=('query_to_doc', 'doc_to_query'), partition_mode='per_direction', lam=0.3)"
    """
    if name not in LOSSES:
        raise ValueError(f"unknown loss {name!r}; choose from {', '.join(LOSSES)}")
    kwargs = dict(kwargs or {})
    preset: dict[str, Any] = {}
    if name == "mixcse_two_way" and "directions" not in kwargs and kwargs.get("layout", "paper") == "paper":
        preset = dict(MIXCSE_TWO_WAY)
    elif name in ("hncse_pm", "hncse_hnm", "hncse_both"):
        preset = {"mode": name.removeprefix("hncse_")}
    elif name == "mnrl_queue":
        preset = {"mask_duplicates": False}
    elif name == "mnrl_hardness":
        preset = {"hardness_mode": "in_batch_negatives", "hardness_strength": 9.0}
    if name.startswith("mnrl") and name != "mnrl_queue":
        preset["scale"] = 1.0 / float(kwargs.pop("temperature", 0.05))
    merged = {**preset, **kwargs}
    arguments = "".join(f", {key}={value!r}" for key, value in merged.items())
    return f"{_loss_class(name).__name__}(model{arguments})"
