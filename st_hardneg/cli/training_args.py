"""``--training-arg KEY=VALUE``: any field of sentence-transformers' ``SentenceTransformerTrainingArguments`` by name,
its value converted to the field's type (:func:`parse_training_args`), and the range checks transformers makes late or
never (:func:`check_training_values`); a ``--config`` file's training arguments go through the same conversion
(:func:`training_arg_items`). Only the standard library is imported at module level.

>>> from st_hardneg.cli.training_args import parse_training_args
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["TRAINING_ARG_RANGES", "check_training_values", "field_types", "parse_training_args",
           "training_arg_items"]

_TRUE = ("true", "yes", "1", "on")
_FALSE = ("false", "no", "0", "off")


def _convert_field(name: str, raw: str, hint: Any, option: str) -> Any:
    """``raw`` (a command-line string) as a value of the field ``name`` whose type is ``hint``."""
    import enum
    import json
    import types
    import typing

    origin = typing.get_origin(hint)
    members = typing.get_args(hint) if origin in (typing.Union, types.UnionType) else (hint,)
    plain = [typing.get_origin(m) or m for m in members]
    text = raw.strip()
    wrong = f"{option} {name}={raw!r}"
    if type(None) in plain and str not in plain and text.lower() in ("none", "null"):
        return None
    if bool in plain:
        if text.lower() in _TRUE:
            return True
        if text.lower() in _FALSE:
            return False
        if str not in plain:
            raise ValueError(f"{wrong}: {name} is true or false")
    if typing.Literal in plain and text.lower() in _FALSE:
        return False
    if int in plain:
        try:
            return int(text)
        except ValueError:
            if float not in plain:
                raise ValueError(f"{wrong}: {name} is a whole number") from None
    if float in plain:
        try:
            return float(text)
        except ValueError:
            raise ValueError(f"{wrong}: {name} is a number") from None
    choices = [m for m in plain if isinstance(m, type) and issubclass(m, enum.Enum)]
    if choices:
        values = [str(member.value) for member in choices[0]]
        if text not in values:
            import difflib

            close = difflib.get_close_matches(text, values, 1)
            hint_text = f" (did you mean {close[0]}?)" if close else ""
            raise ValueError(f"{wrong}: not a choice of {name}{hint_text}; choose from {', '.join(values)}")
        return text
    if dict in plain and text.startswith("{"):
        try:
            value = json.loads(text)
        except ValueError:
            raise ValueError(f"{wrong}: {name} takes a JSON object such as {{\"key\": 1}}") from None
        if not isinstance(value, dict):
            raise ValueError(f"{wrong}: {name} takes a JSON object")
        return value
    if list in plain and ("," in text or str not in plain):
        return [item.strip() for item in text.split(",") if item.strip()]
    if str in plain:
        return text
    raise ValueError(f"{wrong}: {name} ({hint}) cannot be set from the command line")


def parse_training_args(items: list[str] | None, *, reserved: dict[str, str] | None = None,
                        option: str = "--training-arg") -> dict[str, Any]:
    """``["gradient_accumulation_steps=2", "bf16=true", "report_to=tensorboard"]`` → ``{"gradient_accumulation_steps":
    2, "bf16": True, "report_to": "tensorboard"}``: any field of ``SentenceTransformerTrainingArguments``, converted
    to the field's type (``true``/``false``; whole numbers; numbers; a choice of the field's enum; ``none``; a JSON
    object for a dict field; ``a,b`` for a list field). The result goes into ``TrainConfig.extra_args``, where it
    overrides the recipe's value.

    Args:
        items: ``KEY=VALUE`` strings.
        reserved: fields that have their own option, field → option (e.g. ``{"learning_rate": "--lr"}``): refused
            with that option's name.
        option: the command-line option named in the error messages.

    Returns:
        The converted values by field name.

    Raises:
        ValueError: an item without ``=``, an unknown field (with the closest field's name), a field given twice or
            reserved, or a value of the wrong type.

    Example:
        ::

            >>> parse_training_args(["gradient_accumulation_steps=2", "save_strategy=steps"])
            {'gradient_accumulation_steps': 2, 'save_strategy': 'steps'}
    """
    import difflib

    hints = field_types()
    fields = list(hints)
    result: dict[str, Any] = {}
    for item in items or []:
        key, sep, raw = item.partition("=")
        name = key.strip().replace("-", "_")
        if not sep or not name:
            raise ValueError(f"{option} expects KEY=VALUE, got {item!r}")
        if name not in fields:
            close = difflib.get_close_matches(name, list(fields), 1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise ValueError(f"{option}: SentenceTransformerTrainingArguments has no field {name}{hint}")
        if reserved and name in reserved:
            raise ValueError(f"{option} {name}: set it with {reserved[name]}")
        if name in result:
            raise ValueError(f"{option} gives {name} twice; give it once")
        result[name] = _convert_field(name, raw, hints[name], option)
    return result


#: ``--training-arg`` fields transformers checks late (at ``train()``) or never, with the range each must lie in:
#: field → (lowest, highest, lowest included, highest included, what it is)
TRAINING_ARG_RANGES: dict[str, tuple[float, float, bool, bool, str]] = {
    "gradient_accumulation_steps": (1, math.inf, True, False, "a whole number of batches >= 1"),
    "per_device_eval_batch_size": (1, math.inf, True, False, "a batch size >= 1"),
    "dataloader_num_workers": (0, math.inf, True, False, "a number of worker processes >= 0"),
    "max_grad_norm": (0, math.inf, True, False, "a gradient norm >= 0 (0 = no clipping)"),
    "weight_decay": (0, math.inf, True, False, "a decay >= 0"),
    "label_smoothing_factor": (0, 1, True, False, "a share in [0, 1)"),
    "adam_beta1": (0, 1, True, False, "a decay rate in [0, 1)"),
    "adam_beta2": (0, 1, True, False, "a decay rate in [0, 1)"),
    "adam_epsilon": (0, math.inf, False, False, "a number > 0"),
    "save_total_limit": (1, math.inf, True, False, "a number of checkpoints >= 1 (or none: keep all)"),
}


def check_training_values(extra_args: dict[str, Any], option: str = "--training-arg") -> None:
    """The range checks transformers makes only when training starts, or never (:data:`TRAINING_ARG_RANGES`), and
    ``report_to`` integrations that are not installed: all before any model loads.

    Raises:
        ValueError: one line naming the field, the value and the range (or the missing package).
    """
    for name, (low, high, low_in, high_in, what) in TRAINING_ARG_RANGES.items():
        if name not in extra_args or extra_args[name] is None:
            continue
        value = extra_args[name]
        number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        inside = number and (value >= low if low_in else value > low) and (value <= high if high_in else value < high)
        if not inside:
            raise ValueError(f"{option} {name}={value!r}: {name} is {what}")
    report = extra_args.get("report_to")
    wanted = [report] if isinstance(report, str) else list(report or [])
    wanted = [item for item in wanted if item not in ("none", "all")]
    if wanted:
        from transformers.integrations import get_available_reporting_integrations, get_reporting_integration_callbacks

        try:
            get_reporting_integration_callbacks(wanted)
        except ValueError as exc:
            raise ValueError(f"{option} report_to: {' '.join(str(exc).split())}") from None
        installed = get_available_reporting_integrations()
        missing = [item for item in wanted if item not in installed]
        if missing:
            raise ValueError(f"{option} report_to={','.join(wanted)}: {', '.join(missing)} is not installed (pip install "
                             f"{' '.join(missing)}); installed: {', '.join(installed) or 'none'}")


def field_types() -> dict[str, Any]:
    """``SentenceTransformerTrainingArguments``' ``init`` fields, name → resolved type hint."""
    import dataclasses
    import typing

    from sentence_transformers import SentenceTransformerTrainingArguments

    hints = typing.get_type_hints(SentenceTransformerTrainingArguments)
    return {f.name: hints[f.name] for f in dataclasses.fields(SentenceTransformerTrainingArguments) if f.init}


def training_arg_items(values: dict[str, Any]) -> list[str]:
    """``{"gradient_accumulation_steps": 2, "report_to": ["tensorboard"], "bf16": True}`` (a ``--config`` file's
    values, as JSON or YAML read them) → ``["gradient_accumulation_steps=2", "report_to=tensorboard", "bf16=true"]``,
    the ``--training-arg`` items :func:`parse_training_args` converts and checks exactly as if typed."""
    import json

    items = []
    for name, value in values.items():
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif value is None:
            text = "none"
        elif isinstance(value, dict):
            text = json.dumps(value)
        elif isinstance(value, (list, tuple)):
            text = ",".join(str(item) for item in value)
        else:
            text = str(value)
        items.append(f"{name}={text}")
    return items
