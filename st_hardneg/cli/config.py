"""``st-hardneg train --config FILE.{json,yaml}`` and the Hugging Face spellings of the command line.

A config file holds what the command line holds, with the conventions of transformers' ``HfArgumentParser``
(``parse_json_file`` / ``parse_yaml_file``): one mapping whose keys are the option names with underscores
(``loss``, ``batch_size``, ``loss_arg``, ...) and any field of ``SentenceTransformerTrainingArguments``
(``gradient_accumulation_steps``, ``bf16``, ...; the fields that have their own option, such as ``learning_rate`` or
``per_device_train_batch_size``, set that option). Options given on the command line override the file; a
repeatable option (``--loss-arg``, ``--mining-arg``, ``--training-arg``) overrides it key by key.

::

    # config.yaml
    task: beir
    data: data/scifact
    loss: mixcse
    loss_arg: {lam: 0.3}
    per_device_train_batch_size: 64
    gradient_accumulation_steps: 2

    st-hardneg train --config config.yaml --seed 1      # --seed wins over the file

On the command line, ``--per_device_train_batch_size 8`` (HF's spelling) is read as ``--batch-size 8`` and
``--gradient_accumulation_steps 2`` as ``--training-arg gradient_accumulation_steps=2``, each said in one line on
stderr (:func:`hf_style_argv`); ``--output_dir`` is ``--output-dir``.

Every check here runs before any model loads; a bad file is one line naming the file and the key (exit status 2).
Only the standard library is imported at module level (``yaml`` and transformers when a file or an HF flag is read).
"""

from __future__ import annotations

import argparse
import difflib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["CONFIG_SUFFIXES", "HF_FIELD_OPTIONS", "REPEATABLE", "TrainConfigFile", "apply_config", "hf_style_argv",
           "read_config", "read_train_config"]

#: the file types ``--config`` reads
CONFIG_SUFFIXES = (".json", ".yaml", ".yml")
#: ``SentenceTransformerTrainingArguments`` fields that set a ``train`` option of their own: field → option's dest
HF_FIELD_OPTIONS = {"output_dir": "output_dir", "per_device_train_batch_size": "batch_size", "learning_rate": "lr",
                    "num_train_epochs": "epochs", "max_steps": "max_steps", "warmup_ratio": "warmup_ratio",
                    "seed": "seed", "eval_steps": "eval_steps"}
#: the repeatable ``KEY=VALUE`` options: a file's items are overridden key by key by the command line's
REPEATABLE = ("loss_arg", "mining_arg", "training_arg")
#: ``train`` options a file does not set (they are about the file or the command itself)
_NOT_IN_FILES = ("config", "help", "func", "command")


class ConfigError(ValueError):
    """A config file that does not parse, names an unknown option, or gives a value of the wrong type (one line)."""


@dataclass
class TrainConfigFile:
    """A ``--config`` file, read and checked.

    Attributes:
        path: the file.
        defaults: option dest → value, the file's values for the options that take one value.
        items: option dest (:data:`REPEATABLE`) → the file's ``KEY=VALUE`` items (TrainingArguments fields under
            ``training_arg``).
    """

    path: Path
    defaults: dict[str, Any] = field(default_factory=dict)
    items: dict[str, list[str]] = field(default_factory=dict)


def read_config(path: str | Path) -> dict[str, Any]:
    """The mapping in a ``.json`` or ``.yaml`` / ``.yml`` file.

    Raises:
        ConfigError: another suffix, a missing file, a file that does not parse, or one that is not a mapping of
            names (the message names the file, and the line where the parser stopped).
    """
    file = Path(path).expanduser()
    if file.suffix.lower() not in CONFIG_SUFFIXES:
        raise ConfigError(f"--config {file}: a config file is .json, .yaml or .yml")
    if not file.is_file():
        raise ConfigError(f"--config {file}: no such file")
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--config {file}: cannot be read ({exc})") from None
    if file.suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{file}: does not parse as JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})") \
                from None
    else:
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
            problem = getattr(exc, "problem", None) or type(exc).__name__
            raise ConfigError(f"{file}: does not parse as YAML: {problem}{where}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict) or not all(isinstance(key, str) for key in data):
        raise ConfigError(f"{file}: the file holds {type(data).__name__}, not a mapping of option names to values")
    return data


def _actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {action.dest: action for action in parser._actions if action.option_strings and action.dest not in
            _NOT_IN_FILES}


def _option(action: argparse.Action) -> str:
    return max(action.option_strings, key=len)


def _check_value(file: Path, key: str, value: Any, action: argparse.Action) -> Any:
    """``value`` of ``key`` as the option ``action`` would hold it, or :class:`ConfigError`."""
    def wrong(what: str) -> ConfigError:
        return ConfigError(f"{file}: {key}: {what}, got {value!r} ({_option(action)})")

    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        if not isinstance(value, bool):
            raise wrong("true or false")
        return value
    if isinstance(action, argparse._CountAction):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise wrong("a count >= 0")
        return value
    if value is None:
        if action.default is not None:
            raise wrong(f"a value (its default is {action.default!r})")
        return None
    if action.type is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise wrong("a whole number")
    elif action.type is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise wrong("a number")
        value = float(value)
    elif not isinstance(value, str):
        raise wrong("a string")
    if action.choices is not None and value not in action.choices:
        raise wrong(f"one of {', '.join(map(str, action.choices))}")
    return value


def _items(file: Path, key: str, value: Any) -> list[str]:
    """A repeatable option's value in a file: a mapping ``{lam: 0.3}`` or a list of ``KEY=VALUE`` strings."""
    if isinstance(value, dict):
        return [_item(name, item) for name, item in value.items()]
    if isinstance(value, list) and all(isinstance(item, str) and "=" in item for item in value):
        return list(value)
    raise ConfigError(f"{file}: {key}: a mapping of KEY: VALUE or a list of 'KEY=VALUE' strings, got {value!r}")


def _item(name: str, value: Any) -> str:
    """``name=value`` as typed on the command line, read back by ``parse_loss_args`` as ``value`` (a string that
    would read as another type is quoted)."""
    from st_hardneg.training.registry import parse_loss_args

    text = repr(value) if isinstance(value, (list, tuple, dict)) else str(value)
    if isinstance(value, str) and parse_loss_args([f"{name}={value}"])[name] != value:
        text = repr(value)
    return f"{name}={text}"


def read_train_config(path: str | Path, parser: argparse.ArgumentParser) -> TrainConfigFile:
    """Read and check ``path`` against the ``train`` subcommand's ``parser``: every key an option (underscores) or a
    ``SentenceTransformerTrainingArguments`` field, every value of the option's or the field's type.

    Raises:
        ConfigError: one line naming the file and the key: the file does not parse, a key is unknown (with the
            closest name), given twice (an option and the field that sets it), or its value has the wrong type.
    """
    from st_hardneg.cli.checks import RESERVED_TRAINING_ARGS
    from st_hardneg.cli.training_args import field_types, parse_training_args, training_arg_items

    file = Path(path).expanduser()
    data = read_config(file)
    actions = _actions(parser)
    fields = field_types()
    result = TrainConfigFile(file)
    training: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for raw_key, value in data.items():
        key = raw_key.replace("-", "_")
        dest = key if key in actions else HF_FIELD_OPTIONS.get(key)
        if key in _NOT_IN_FILES:
            raise ConfigError(f"{file}: {raw_key}: not an option a config file sets")
        if dest is not None:
            if dest in origin:
                raise ConfigError(f"{file}: {raw_key}: gives {_option(actions[dest])} again (as {origin[dest]}); "
                                  "give it once")
            origin[dest] = raw_key
            if dest in REPEATABLE:
                result.items[dest] = _items(file, raw_key, value)
            else:
                result.defaults[dest] = _check_value(file, raw_key, value, actions[dest])
        elif key in fields:
            if key in RESERVED_TRAINING_ARGS:
                raise ConfigError(f"{file}: {raw_key}: set it with {RESERVED_TRAINING_ARGS[key]}")
            training[key] = value
        else:
            close = difflib.get_close_matches(key, [*actions, *fields], 1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise ConfigError(f"{file}: {raw_key}: not an option of st-hardneg train nor a field of "
                              f"SentenceTransformerTrainingArguments{hint}")
    if training:
        items = training_arg_items(training)
        try:
            parse_training_args(items, option=str(file))  # each value of its field's type, checked now
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        result.items["training_arg"] = [*items, *result.items.get("training_arg", [])]
        try:
            parse_training_args(result.items["training_arg"], option=str(file))
        except ValueError as exc:  # a field under training_arg and at the top level too
            raise ConfigError(str(exc)) from None
    return result


def apply_config(args: argparse.Namespace, config: TrainConfigFile, given: dict[str, list[str]]) -> None:
    """Put the file's repeatable items under the command line's, in place: for each of :data:`REPEATABLE`, the
    file's items whose key the command line (``given``, dest → its items) does not give, then the command line's."""
    for dest in REPEATABLE:
        cli_items = given.get(dest) or []
        keys = {item.partition("=")[0].strip().replace("-", "_") for item in cli_items}
        kept = [item for item in config.items.get(dest, [])
                if item.partition("=")[0].strip().replace("-", "_") not in keys]
        merged = kept + list(cli_items)
        setattr(args, dest, merged or None)


def hf_style_argv(argv: Sequence[str], parser: argparse.ArgumentParser) -> tuple[list[str], list[str]]:
    """``argv`` of ``train`` with the Hugging Face spellings read as st-hardneg's (``HfArgumentParser`` accepts
    ``--output_dir`` and ``--output-dir`` alike): ``--some_option`` is ``--some-option``; a
    ``SentenceTransformerTrainingArguments`` field with an option of its own (:data:`HF_FIELD_OPTIONS`) is that
    option (``--per_device_train_batch_size 8`` → ``--batch-size 8``); any other field is ``--training-arg``
    (``--gradient_accumulation_steps 2`` → ``--training-arg gradient_accumulation_steps=2``; a boolean field alone,
    ``--bf16``, is ``=true``). Returns the new argv and one note per rewritten flag.

    Raises:
        ValueError: a field that ``train`` sets another way (``--warmup_steps``: use ``--warmup-ratio``), or a field
            without its value.
    """
    from st_hardneg.cli.checks import RESERVED_TRAINING_ARGS

    options = {s for action in parser._actions for s in action.option_strings}
    by_dest = {action.dest: _option(action) for action in parser._actions if action.option_strings}
    out: list[str] = []
    notes: list[str] = []
    fields: dict[str, Any] | None = None
    tokens = list(argv)
    i = 0
    while i < len(tokens):
        token = tokens[i]
        i += 1
        if token == "--":
            out.extend(tokens[i - 1:])
            break
        name, eq, inline = token[2:].partition("=")
        if not token.startswith("--") or token.split("=")[0] in options:
            out.append(token)
            continue
        dashed = "--" + name.replace("_", "-")
        if "_" in name and dashed in options:
            out.append(dashed + (f"={inline}" if eq else ""))
            continue
        if fields is None:
            from st_hardneg.cli.training_args import field_types

            fields = field_types()
        if name not in fields:
            out.append(token)  # argparse names it as unrecognized
            continue
        if eq:
            value = inline
        elif i < len(tokens) and not tokens[i].startswith("--"):
            value, i = tokens[i], i + 1
        elif "bool" in str(fields[name]):
            value = "true"
        else:
            raise ValueError(f"--{name} (a TrainingArguments field) needs a value: --training-arg {name}=VALUE")
        if name in HF_FIELD_OPTIONS:
            option = by_dest[HF_FIELD_OPTIONS[name]]
            out.extend([option, value])
            notes.append(f"--{name} {value} is read as {option} {value}")
        elif name in RESERVED_TRAINING_ARGS:
            raise ValueError(f"--{name} is a TrainingArguments field that st-hardneg train sets with "
                             f"{RESERVED_TRAINING_ARGS[name]}")
        else:
            out.extend(["--training-arg", f"{name}={value}"])
            notes.append(f"--{name} {value} is read as --training-arg {name}={value}")
    return out, notes
