"""Argument checks shared by every st-hardneg loss: one place, one wording.

Each function returns the value converted to its canonical type (``float``, ``int``, ``bool``...) or raises a
``ValueError`` that names the argument and shows what was given. They know nothing about losses, so any
constructor can use them.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Iterable
from typing import Any

from torch import Tensor, nn

#: the largest logit magnitude a loss may produce. float32 overflows at 3.4e38; the extra 1e8 of headroom keeps the
#: gradients finite too (they are the logit slope 1/τ times at most 1/eps of the normalisation, see
#: :data:`st_hardneg.functional.NORM_EPS`).
MAX_LOGIT = 1e30


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


def check_guide(guide: Any, model: Any, margin: float | None) -> bool:
    """Check a false-negative ``guide`` model against the trained ``model``; return whether the texts must be
    re-tokenised for it (its vocabulary differs from the model's, or its ``max_seq_length`` is shorter).

    A guide only decides the false-negative threshold, so it needs a ``margin``; both models need a Hugging Face
    tokenizer (``.tokenizer`` with ``get_vocab()``), and re-tokenising needs the model's ``batch_decode``.
    """
    if margin is None:
        raise ValueError("guide is only used by the false-negative threshold: also set false_negative_margin "
                         "(e.g. 0.0 masks every candidate the guide finds closer than the positive)")
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
    "MAX_LOGIT", "check_bool", "check_choice", "check_count", "check_guide", "check_momentum", "check_non_negative",
    "check_number", "check_optional_count", "check_optional_non_negative", "check_seed", "check_temperature", "check_unit_interval", "check_weight_or_callable",
    "check_weights_tensor",
]
