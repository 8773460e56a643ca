"""Argument checks shared by every st-hardneg loss: one place, one wording.

Each function returns the value converted to its canonical type (``float``, ``int``, ``bool``...) or raises a
``ValueError`` that names the argument and shows what was given. They know nothing about losses, so any
constructor can use them.
"""

from __future__ import annotations

import math
import operator
import sys
import warnings
from collections.abc import Callable, Iterable, Mapping
from types import FrameType
from typing import Any

from torch import Tensor, nn

#: the largest logit magnitude a loss may produce. float32 overflows at 3.4e38; the extra 1e8 of headroom keeps the
#: gradients finite too (they are the logit slope 1/τ times at most 1/eps of the normalisation, see
#: :data:`st_hardneg.functional.NORM_EPS`).
MAX_LOGIT = 1e30

_PACKAGE = __name__.partition(".")[0]


def user_stacklevel() -> int:
    """The ``stacklevel`` that points a warning raised by the caller of this function at the user's line: the first
    frame, counting outwards from that caller (level 1), whose module is not part of st-hardneg (a dataclass's
    generated ``__init__`` counts as its class's module). Right whatever the depth of the library's own calls (a
    loss's constructor, its options, a subclass's ``super().__init__``).

    Example:
        ::

            warnings.warn(message, UserWarning, stacklevel=user_stacklevel())
    """
    frame = sys._getframe(1)
    level = 1
    while frame.f_back is not None and _in_package(frame):
        frame = frame.f_back
        level += 1
    return level


def _in_package(frame: FrameType) -> bool:
    module = str(frame.f_globals.get("__name__", ""))
    return module == _PACKAGE or module.startswith(f"{_PACKAGE}.")


def check_number(value: Any, name: str, minimum: float | None = None, maximum: float | None = None,
                 maximum_open: bool = False) -> float:
    """A finite real number, optionally within ``[minimum, maximum]`` (``[minimum, maximum)`` with ``maximum_open``)."""
    bounds = _describe_bounds(minimum, maximum, maximum_open)
    if isinstance(value, bool) or value is None or isinstance(value, str):
        raise ValueError(f"{name} must be a finite number{bounds}, got {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a finite number{bounds}, got {value!r}") from None
    above = maximum is not None and (number >= maximum if maximum_open else number > maximum)
    if not math.isfinite(number) or (minimum is not None and number < minimum) or above:
        raise ValueError(f"{name} must be a finite number{bounds}, got {value!r}")
    return number


def _describe_bounds(minimum: float | None, maximum: float | None, maximum_open: bool = False) -> str:
    if minimum is not None and maximum is not None:
        return f" in [{minimum:g}, {maximum:g}{')' if maximum_open else ']'}"
    if minimum is not None:
        return f" >= {minimum:g}"
    if maximum is not None:
        return f" {'<' if maximum_open else '<='} {maximum:g}"
    return ""


def check_non_negative(value: Any, name: str) -> float:
    """A finite number >= 0."""
    return check_number(value, name, minimum=0.0)


def check_unit_interval(value: Any, name: str) -> float:
    """A number in [0, 1] (a mixing weight)."""
    return check_number(value, name, minimum=0.0, maximum=1.0)


def check_momentum(value: Any, name: str) -> float:
    """A momentum (EMA or SGD) in [0, 1): 1 would never move."""
    return check_number(value, name, minimum=0.0, maximum=1.0, maximum_open=True)


def check_optional_non_negative(value: Any, name: str) -> float | None:
    """``None`` (the feature is off) or a finite number >= 0."""
    return None if value is None else check_non_negative(value, name)


def check_temperature(value: Any, name: str = "temperature", max_abs_similarity: float = 1.0) -> float:
    """A temperature τ > 0 whose largest logit ``max_abs_similarity / τ`` stays below :data:`MAX_LOGIT`.

    Args:
        value: τ.
        name: the argument's name in the error message.
        max_abs_similarity: the largest magnitude the numerator of a logit can reach: 1 for a cosine, ``1 + m`` for
            the Focal-InfoNCE negative logit ``s (s + m) / τ``.
    """
    if isinstance(value, bool) or value is None or isinstance(value, str):
        raise ValueError(f"{name} must be a positive, finite number, got {value!r}")
    try:
        tau = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a positive, finite number, got {value!r}") from None
    if not (tau > 0 and math.isfinite(tau)):
        raise ValueError(f"{name} must be a positive, finite number, got {value!r}")
    if max_abs_similarity / tau > MAX_LOGIT:
        raise ValueError(
            f"{name}={value!r} is too small: the logits reach {max_abs_similarity:g} / {name} = "
            f"{max_abs_similarity / tau:.3g}, beyond {MAX_LOGIT:g}, and would overflow float32 (or its gradient)"
        )
    return tau


def check_focal_margin_range(margin: float | None, name: str, temperature: float) -> None:
    """Raise if the Focal-InfoNCE negative logits ``s (s + m) / τ``, which reach ``(1 + m) / τ`` on cosines,
    overflow for this margin ``m`` (``None``: no modulation) at the given temperature ``τ``, which was already
    checked for plain cosine logits: the message blames ``m`` (named ``name``), the argument that made them too
    large, and says that the temperature is too small for it."""
    if margin is None:
        return
    largest = (1.0 + margin) / temperature
    if largest > MAX_LOGIT:
        raise ValueError(
            f"{name}={margin!r} is too large for temperature={temperature!r}: the negative logits s (s + m) / "
            f"temperature reach (1 + m) / temperature = {largest:.3g}, beyond {MAX_LOGIT:g}, and would overflow "
            f"float32 (or its gradient). Lower {name.split(' ')[0]}, or raise the temperature (too small for this m).")


def check_count(value: Any, name: str, minimum: int = 1) -> int:
    """An integer (not a bool, not a float) >= ``minimum``."""
    expected = "a non-negative integer" if minimum == 0 else f"an integer >= {minimum}"
    if isinstance(value, bool):
        raise ValueError(f"{name} must be {expected}, got {value!r}")
    try:
        count = operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be {expected}, got {value!r}") from None
    if count < minimum:
        raise ValueError(f"{name} must be {expected}, got {value!r}")
    return count


def clamp_count(value: int, name: str, limit: int, reason: str, *, owner: str, remedy: str,
                warn: bool = True) -> int:
    """The one rule for a count or size that cannot be met: ``value``, or ``limit`` with a warning.

    Every count argument of a loss is checked in two steps. A value that no data could meet (below its minimum, not
    an integer) is a ``ValueError`` (:func:`check_count`). A value above what the loss's other arguments or the
    batch allow (``num_mixed`` above the ``k (k - 1)`` ordered pairs of ``k`` hard negatives; ``k`` above a small
    batch's negatives) is clamped to that limit, with a ``UserWarning`` naming the argument, the limit and why
    (``warn``: the caller shows it once per loss). Nothing is met by silently repeating work (copies of one mixture
    in a denominator) or silently dropping it.
    """
    if value <= limit:
        return value
    if warn:
        warnings.warn(clamped_count_message(owner, name, value, limit, reason, remedy), UserWarning,
                      stacklevel=user_stacklevel())
    return limit


def clamped_count_message(owner: str, name: str, value: int, limit: int, reason: str, remedy: str) -> str:
    """The warning of a count clamped to what the arguments or a batch allow (see :func:`clamp_count`)."""
    return f"{owner}: {name}={value} but {reason}; using {name}={limit}. {remedy} (this warning is shown once)."


def check_optional_count(value: Any, name: str) -> int | None:
    """``None`` (off) or a positive integer."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive integer or None, got {value!r}")
    return value


def check_choice(value: Any, name: str, choices: Iterable[str]) -> str:
    """One of ``choices``."""
    choices = tuple(choices)
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(repr(c) for c in choices)}; got {value!r}")
    return value


def check_bool(value: Any, name: str) -> bool:
    """``True`` or ``False`` (numpy and torch booleans too); a string such as ``"no"`` is an error, not truthy."""
    if isinstance(value, bool):
        return value
    if type(value).__name__ in ("bool_", "bool") and hasattr(value, "item"):
        return bool(value.item())
    raise ValueError(f"{name} must be True or False, got {value!r}")


def check_seed(value: Any, name: str = "seed") -> int | None:
    """``None`` (use torch's global generator) or an integer >= 0."""
    if value is None:
        return None
    return check_count(value, name, minimum=0)


def check_scale_or_temperature(scale: Any, temperature: Any, default_temperature: float = 0.05,
                               max_abs_similarity: float = 1.0) -> float:
    """The temperature τ from sentence-transformers' ``scale`` (= 1/τ) or from ``temperature`` (at most one of the
    two; neither: ``default_temperature``). Warns when τ > 1 (scale < 1): that is almost always a scale given as a
    temperature (``temperature=20`` for ``scale=20``), which makes every logit nearly equal."""
    if scale is not None and temperature is not None:
        raise ValueError(f"give either scale (sentence-transformers' name, = 1/temperature) or temperature, not both; "
                         f"got scale={scale!r} and temperature={temperature!r}")
    if scale is not None:
        value = check_number(scale, "scale (= 1/temperature)")
        if not value > 0:
            raise ValueError(f"scale (= 1/temperature) must be a positive, finite number, got {scale!r}")
        tau = check_temperature(1.0 / value, "1/scale", max_abs_similarity)
        given = f"scale={scale!r}"
    else:
        tau = check_temperature(default_temperature if temperature is None else temperature, "temperature",
                                max_abs_similarity)
        given = f"temperature={temperature!r}"
    if tau > 1.0:
        warnings.warn(
            f"{given} means a temperature of {tau:g} (scale {1.0 / tau:g}): every logit is then within "
            f"{2.0 / tau:.3g} of every other and the loss barely trains. Did you mean "
            f"{'scale' if temperature is not None else 'temperature'}={tau if scale is not None else temperature!r}? "
            "(scale = 1/temperature; sentence-transformers' default scale=20 is temperature=0.05.)",
            UserWarning, stacklevel=user_stacklevel())
    return tau


#: the similarity functions a loss can take, by the name sentence-transformers gives them
SIMILARITY_FUNCTIONS = ("cos_sim", "dot_score")


def check_similarity_fct(value: Any) -> str:
    """``"cos_sim"`` or ``"dot_score"`` from sentence-transformers' ``util.cos_sim`` / ``util.dot_score`` (or
    their names)."""
    name = value if isinstance(value, str) else getattr(value, "__name__", None)
    module = "" if isinstance(value, str) else str(getattr(value, "__module__", ""))
    if name in SIMILARITY_FUNCTIONS and (isinstance(value, str) or module.startswith("sentence_transformers")):
        return name
    raise ValueError(
        "similarity_fct must be sentence_transformers.util.cos_sim or sentence_transformers.util.dot_score (or "
        f"their names {list(SIMILARITY_FUNCTIONS)}), got {value!r}: the losses build their synthetic negatives "
        "from these two similarities and cannot use an arbitrary function")


def check_directions(directions: Any, partition_mode: Any) -> tuple[tuple[str, ...], str]:
    """sentence-transformers' ``directions`` (a non-empty tuple of its four names, ``"query_to_doc"`` included, no
    repeats) and ``partition_mode`` (``"joint"`` or ``"per_direction"``; per-direction needs every direction to
    contain the positive, so not ``query_to_query`` / ``doc_to_doc``)."""
    valid = ("query_to_doc", "query_to_query", "doc_to_query", "doc_to_doc")
    if isinstance(directions, str) or not isinstance(directions, Iterable):
        raise ValueError(f"directions must be a tuple of {list(valid)}, e.g. ('query_to_doc', 'doc_to_query'), "
                         f"got {directions!r}")
    directions = tuple(directions)
    unknown = [d for d in directions if d not in valid]
    if unknown or not directions:
        raise ValueError(f"directions must be a non-empty tuple of {list(valid)}, got {directions!r}")
    if len(set(directions)) != len(directions):
        raise ValueError(f"directions must not repeat a direction, got {directions!r}")
    if "query_to_doc" not in directions:
        raise ValueError(f"directions must include 'query_to_doc' (it holds the positive pairs), got {directions!r}")
    mode = check_choice(partition_mode, "partition_mode", ("joint", "per_direction"))
    if mode == "per_direction" and {"query_to_query", "doc_to_doc"} & set(directions):
        raise ValueError("partition_mode='per_direction' needs every direction to contain the positive pair; "
                         "'query_to_query' and 'doc_to_doc' do not. Use partition_mode='joint'.")
    return directions, mode


def check_hardness(mode: Any, strength: Any) -> tuple[str | None, float]:
    """sentence-transformers' ``hardness_mode`` (``None`` or one of its three modes) and ``hardness_strength``
    (>= 0). A mode with strength 0 changes nothing and warns, as in sentence-transformers."""
    if mode is not None:
        mode = check_choice(mode, "hardness_mode", ("in_batch_negatives", "hard_negatives", "all_negatives"))
    value = check_non_negative(strength, "hardness_strength")
    if mode is not None and value == 0.0:
        warnings.warn(f"hardness_mode={mode!r} is set but hardness_strength=0.0, so hardness weighting has no "
                      "effect; set hardness_strength > 0 (ST's docs: 9 for in_batch_negatives, 5 for hard_negatives)",
                      UserWarning, stacklevel=user_stacklevel())
    return mode, value


def check_guide(guide: Any, model: Any) -> bool:
    """Check a false-negative ``guide`` model against the trained ``model``; return whether the texts must be
    re-tokenised for it (its vocabulary differs from the model's, or its ``max_seq_length`` is shorter).

    A guide decides the false-negative threshold (``margin``; a guide alone means margin 0, as in GISTEmbedLoss);
    both models need a Hugging Face tokenizer (``.tokenizer`` with ``get_vocab()``), and re-tokenising needs the
    model's ``batch_decode``.
    """
    if not isinstance(guide, nn.Module) or not callable(guide):
        raise ValueError(f"guide must be a SentenceTransformer model, got {type(guide).__name__}")
    model_tok, guide_tok = getattr(model, "tokenizer", None), getattr(guide, "tokenizer", None)
    if model_tok is None or guide_tok is None or not hasattr(model_tok, "get_vocab") or not hasattr(
            guide_tok, "get_vocab"):
        raise ValueError("guide: the model and the guide must both have a Hugging Face tokenizer "
                         "(`.tokenizer` with `get_vocab()`), to re-tokenise the texts for the guide if needed")
    retokenize = bool(model_tok.get_vocab() != guide_tok.get_vocab()
                      or getattr(guide, "max_seq_length", 0) < getattr(model, "max_seq_length", 0))
    if retokenize and not hasattr(model_tok, "batch_decode"):
        raise ValueError("guide: the guide's tokenizer differs from the model's, and the model's tokenizer "
                         "cannot decode token ids back to text (no batch_decode)")
    return retokenize


def check_weight_or_callable(value: Any, name: str, names: Iterable[str] = ()) -> float | str | Callable:
    """A mixing weight: a number in [0, 1], a callable returning weights, or one of the registered ``names``."""
    names = tuple(names)
    if isinstance(value, str):
        if value not in names:
            raise ValueError(f"{name} must be a number in [0, 1], a callable or one of {list(names)}, got {value!r}")
        return value
    if callable(value):
        return value
    return check_unit_interval(value, name)


def check_weights_tensor(weights: Tensor, name: str) -> Tensor:
    """Raise if a computed weight tensor (e.g. what a user's ``alpha`` callable returned) has a value outside
    [0, 1] or a NaN."""
    bad = ~((weights >= 0) & (weights <= 1))  # NaN fails both comparisons
    if weights.device.type != "meta" and bool(bad.any()):
        example = weights[bad].flatten()[0].item()
        raise ValueError(f"{name} must return weights in [0, 1]; got {example!r} "
                         f"({int(bad.sum())} of {weights.numel()} values out of range or NaN)")
    return weights


__all__ = [
    "MAX_LOGIT", "check_bool", "check_choice", "check_count", "check_focal_margin_range", "check_guide",
    "check_momentum", "check_non_negative",
    "check_number", "check_optional_count", "check_optional_non_negative", "check_seed", "check_temperature", "check_unit_interval", "check_weight_or_callable",
    "check_weights_tensor", "check_known_positives", "clamp_count", "clamped_count_message", "user_stacklevel",
]


def check_relevant_docs(relevant_docs: Any, name: str = "relevant_docs") -> dict[str, set[str]]:
    """``{query id: set of document ids}`` from a mapping of query ids to collections of string ids.

    Raises:
        TypeError: ``relevant_docs`` is not a mapping, a value is a string (``{"q1": "d12"}`` would otherwise be
            read as the ids ``"d"``, ``"1"``, ``"2"``), a mapping or not a collection, or an id is not a string; the
            message names the query.
    """
    if not isinstance(relevant_docs, Mapping):
        raise TypeError(f"{name} must map query ids to sets of document ids, got {type(relevant_docs).__name__}")
    out: dict[str, set[str]] = {}
    for query, docs in relevant_docs.items():
        if isinstance(docs, str | bytes):
            raise TypeError(f"{name}[{query!r}] is the string {docs!r}, not a set of document ids: a string would be "
                            f"read as its characters; write {{{docs!r}}}")
        if isinstance(docs, Mapping) or not isinstance(docs, Iterable):
            raise TypeError(f"{name}[{query!r}] must be a set (or list) of document ids, got {type(docs).__name__}"
                            + (" (graded qrels? pass the ids whose score is > 0)" if isinstance(docs, Mapping) else ""))
        ids = set(docs)
        bad = next((doc for doc in ids if not isinstance(doc, str)), None)
        if bad is not None:
            raise TypeError(f"{name}[{query!r}] holds {bad!r} ({type(bad).__name__}); document ids are strings")
        out[query] = ids
    return out


def check_ids(value: Any, name: str) -> frozenset[str]:
    """A collection of ids (strings) as a frozenset: a string (which would be read as its characters), a mapping or a
    non-iterable is refused, and so is an id that is not a string (a float would be truncated, a list is unhashable).

    Raises:
        TypeError: naming ``name`` and the offending value.
    """
    if isinstance(value, str | bytes):
        raise TypeError(f"{name} is the string {value[:60]!r}, not a collection of ids: a string would be read as its "
                        f"characters; write {{{value[:60]!r}}}")
    if isinstance(value, Mapping) or not isinstance(value, Iterable):
        raise TypeError(f"{name} must be a set (or list) of ids, got {type(value).__name__}")
    items = list(value)
    bad = next((item for item in items if not isinstance(item, str)), None)
    if bad is not None:
        raise TypeError(f"{name} holds {bad!r} ({type(bad).__name__}); ids are strings")
    return frozenset(items)


def check_known_positives(mapping: Any, name: str = "known_positives") -> dict[str, frozenset[str]]:
    """``{anchor text: frozenset of texts known to be relevant to it}`` from a mapping of strings to collections of
    strings (:mod:`st_hardneg.data.relevance` builds one from BEIR qrels or a group column). An anchor listed with no
    text is dropped; an empty mapping warns (nothing can be masked) and returns ``{}``.

    Raises:
        TypeError: ``mapping`` is not a mapping, a key is not a string, a value is a string (it would be read as its
            characters) or not a collection, or holds a non-string; the message names the entry.
    """
    if not isinstance(mapping, Mapping):
        raise TypeError(f"{name} must map anchor texts to sets of texts known to be relevant to them, got "
                        f"{type(mapping).__name__}")
    out: dict[str, frozenset[str]] = {}
    for anchor, texts in mapping.items():
        if not isinstance(anchor, str):
            raise TypeError(f"{name} has the key {anchor!r} ({type(anchor).__name__}); its keys are anchor texts "
                            "(strings): translate ids to texts first, e.g. with "
                            "st_hardneg.data.relevance.known_positives_from_qrels")
        if isinstance(texts, str | bytes):
            raise TypeError(f"{name}[{anchor[:60]!r}] is the string {texts[:60]!r}, not a set of texts: a string would "
                            f"be read as its characters; write {{{texts[:60]!r}}}")
        if isinstance(texts, Mapping) or not isinstance(texts, Iterable):
            raise TypeError(f"{name}[{anchor[:60]!r}] must be a set (or list) of texts, got {type(texts).__name__}")
        items = list(texts)  # a generator is read once, here (a nested list would crash frozenset unnamed)
        bad = next((text for text in items if not isinstance(text, str)), None)
        values = frozenset(text for text in items if isinstance(text, str))
        if bad is not None:
            raise TypeError(f"{name}[{anchor[:60]!r}] holds {bad!r} ({type(bad).__name__}); the relevant texts are "
                            "strings")
        if values:
            out[anchor] = out.get(anchor, frozenset()) | values
    if not out:
        warnings.warn(f"{name} is empty: no candidate can be masked as known-relevant, the loss is the loss without it",
                      UserWarning, stacklevel=user_stacklevel())
    return out


#: the keywords a loss once took under another name: the error names the new one
RENAMED_LOSS_KEYWORDS = {"false_negative_margin": "margin (GISTEmbedLoss's name)",
                         "symmetric": "directions=('query_to_doc', 'doc_to_query'), partition_mode='per_direction'"}


def check_loss_arguments(name: str, model: Any, guide: Any, unknown: Iterable[str] = ()) -> None:
    """Check the arguments of the loss ``name``'s constructor besides its options: no ``unknown`` keyword (a renamed
    one is named, :data:`RENAMED_LOSS_KEYWORDS`), a ``guide`` that is a model (the one positional slot after ``model``
    is GISTEmbedLoss's guide; sentence-transformers' positional ``scale`` landing there is named), and a ``model``
    that is a torch module (or ``None``, the functional path).

    Raises:
        TypeError: any of these, naming the loss.
    """
    for key in unknown:
        hint = f"; it is now {RENAMED_LOSS_KEYWORDS[key]}" if key in RENAMED_LOSS_KEYWORDS else ""
        raise TypeError(f"{name}.__init__() got an unexpected keyword argument {key!r}{hint}")
    if isinstance(guide, int | float | str) and not isinstance(guide, nn.Module):
        hint = (f" Did you mean scale={guide!r} (sentence-transformers' MultipleNegativesRankingLoss(model, "
                f"{guide!r})) or temperature={guide!r}?" if isinstance(guide, int | float) else "")
        raise TypeError(f"{name}: every argument after `model` is keyword-only, except a guide model "
                        f"(GISTEmbedLoss(model, guide)); got {guide!r} as the second positional argument.{hint}")
    if model is not None and not isinstance(model, nn.Module):
        raise TypeError(f"{name}: model must be a SentenceTransformer (or a torch module; None for the functional "
                        f"path compute_loss_from_embeddings), got {type(model).__name__} {model!r:.80}. Load it "
                        "first: SentenceTransformer(name) or st_hardneg.models.load_model(path).")
