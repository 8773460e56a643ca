"""What a model folder on disk holds, read without loading it (no torch, no transformers): the one check of a model
where it enters ``st-hardneg train`` and ``eval`` (:func:`check_model_source`), and the saved SentenceTransformer's
folder of a name or path (:func:`saved_model_dir`). :mod:`st_hardneg.models` re-exports them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["TOKENIZER_FILES", "WEIGHT_FILES", "ModelSource", "check_encoder_folder", "check_model_source",
           "check_local_path", "module_types", "saved_model_dir"]


#: the files one of which a saved tokenizer has (fast ``tokenizer.json``, WordPiece, BPE or SentencePiece vocabularies)
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "spiece.model", "sentencepiece.bpe.model",
                   "tokenizer.model")
#: the weight files one of which an encoder folder has (a single file or a sharded index)
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
@dataclass
class ModelSource:
    """What :func:`check_model_source` found where a model enters.

    Attributes:
        folder: the local folder (or the Hub snapshot in the local cache) the model loads from; ``None`` for the
            embedded default or a Hub name that is not cached (checked when it is downloaded).
        saved: the folder holds a saved SentenceTransformer (``modules.json``); ``False``: a bare encoder.
        router: the saved model has a ``Router`` module (query / document towers).
    """

    folder: Path | None
    saved: bool = False
    router: bool = False


def check_model_source(name_or_path: str | Path | None, option: str = "--model") -> ModelSource:
    """Check a model where it enters (``st-hardneg train`` and ``eval``, before anything loads): the one function
    that decides whether a ``--model`` value can be loaded, and says in one line why not.

    ``name_or_path`` is ``None`` / ``""`` / ``"default"`` (the embedded model), a folder, or a Hugging Face name (its
    snapshot in the local cache is checked like a folder). A folder is checked module by module
    (:func:`check_encoder_folder` for each ``Transformer``, those inside a ``Router`` too; a bare encoder is one).

    Raises:
        ValueError: a file instead of a folder; a folder that is not a model (no ``modules.json``, no
            ``config.json``); an encoder folder without weights or tokenizer files, with unreadable (e.g. truncated)
            weights or a saved ``max_seq_length`` outside 1 .. its position embeddings. The message names the
            folder and the value.
        FileNotFoundError: a path (``/…``, ``./…``, ``~…``) that does not exist.
    """
    if name_or_path in (None, "", "default"):
        return ModelSource(None)
    text = str(name_or_path)
    local = Path(text).expanduser()
    if local.exists() and not local.is_dir():
        raise ValueError(f"{option} {text} is a file, not a model: give the model's folder (with config.json or "
                         "modules.json) or a Hugging Face model name")
    check_local_path(name_or_path)
    folder = local if local.is_dir() else saved_model_dir(name_or_path)
    if folder is None:
        return ModelSource(None)
    if not (folder / "modules.json").is_file():
        if not (folder / "config.json").is_file():
            raise ValueError(f"{option} {text}: {folder} is not a model folder (no modules.json of a "
                             "SentenceTransformer, no config.json of an encoder)")
        check_encoder_folder(folder, option, text)
        return ModelSource(folder, saved=False)
    router = False
    for entry, class_name in zip(_module_entries(folder), module_types(folder), strict=True):
        module_dir = folder / str(entry.get("path", ""))
        short = class_name.rsplit(".", 1)[-1]
        if short == "Transformer":
            check_encoder_folder(module_dir, option, text)
        elif short == "Router":
            router = True
            for sub, sub_type in _router_types(module_dir, option, text).items():
                if sub_type.rsplit(".", 1)[-1] == "Transformer":
                    check_encoder_folder(module_dir / sub, option, text)
    return ModelSource(folder, saved=True, router=router)


def _module_entries(folder: Path) -> list[dict[str, Any]]:
    entries = json.loads((folder / "modules.json").read_text(encoding="utf-8"))  # checked by module_types
    return [entry if isinstance(entry, dict) else {} for entry in entries]


def _router_types(folder: Path, option: str, given: str) -> dict[str, str]:
    """A saved ``Router``'s module folders and their classes (``router_config.json``'s ``types``)."""
    file = folder / "router_config.json"
    try:
        types = json.loads(file.read_text(encoding="utf-8")).get("types", {})
        if not isinstance(types, dict) or not all(isinstance(v, str) for v in types.values()):
            raise TypeError("its types are not a mapping of module classes")
    except (OSError, ValueError, TypeError, AttributeError, UnicodeDecodeError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ValueError(f"{option} {given}: the Router's {file} cannot be read ({reason}): save the model again"
                         ) from None
    return {str(k): v for k, v in types.items()}


def check_encoder_folder(folder: str | Path, option: str = "--model", given: str | None = None) -> None:
    """One encoder folder (a bare encoder, or a saved model's ``Transformer`` module): ``config.json``, weights that
    open (a truncated ``safetensors`` file fails here, not in the middle of a run), tokenizer files, and a saved
    ``max_seq_length`` (``sentence_bert_config.json``) that is an integer from 1 to the encoder's
    ``max_position_embeddings``.

    Raises:
        ValueError: what is missing or wrong, in one line naming the folder, the file and the value.
    """
    folder = Path(folder)
    where = f"{option} {given or folder}" + (f" ({folder})" if given and Path(given).expanduser() != folder else "")
    config: dict[str, Any] = {}
    try:
        loaded = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        config = loaded if isinstance(loaded, dict) else {}
    except FileNotFoundError:
        raise ValueError(f"{where}: no config.json in {folder}: not an encoder folder (save it with "
                         "model.save_pretrained(path))") from None
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"{where}: {folder / 'config.json'} cannot be read ({str(exc).splitlines()[0]})") from None
    weights = [folder / name for name in WEIGHT_FILES if (folder / name).is_file()]
    if not weights:
        raise ValueError(f"{where}: no weights in {folder} (none of {', '.join(WEIGHT_FILES)})")
    if weights[0].name == "model.safetensors":
        from safetensors import SafetensorError, safe_open

        try:
            with safe_open(str(weights[0]), framework="numpy") as handle:  # the header only: no torch
                handle.keys()
        except (SafetensorError, OSError) as exc:
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ValueError(f"{where}: {weights[0]} cannot be read ({reason}): the file is damaged or truncated; "
                             "save or copy the model again") from None
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise ValueError(f"{where}: no tokenizer files in {folder} (none of {', '.join(TOKENIZER_FILES)}): save the "
                         "tokenizer with the model (tokenizer.save_pretrained(path))")
    st_config = folder / "sentence_bert_config.json"
    if st_config.is_file():
        try:
            saved = json.loads(st_config.read_text(encoding="utf-8"))
        except (OSError, ValueError, UnicodeDecodeError) as exc:
            raise ValueError(f"{where}: {st_config} cannot be read ({str(exc).splitlines()[0]})") from None
        length = saved.get("max_seq_length") if isinstance(saved, dict) else None
        limit = config.get("max_position_embeddings")
        limit = limit if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0 else None
        if length is not None and (isinstance(length, bool) or not isinstance(length, int) or length < 1
                                   or (limit is not None and length > limit)):
            bound = f"1 to {limit} (its max_position_embeddings)" if limit else "1 or more"
            raise ValueError(f"{where}: the saved max_seq_length {length!r} in {st_config} must be a whole number "
                             f"of tokens from {bound}: fix the file")


def check_local_path(name_or_path: str | Path) -> None:
    text = str(name_or_path)
    looks_local = isinstance(name_or_path, Path) or text.startswith(("/", "./", "../", "~", "\\")) or (
        len(text) > 1 and text[1] == ":")
    if looks_local and not Path(text).expanduser().exists():
        raise FileNotFoundError(f"model not found: {text} does not exist (pass a model directory or a Hugging Face "
                                "model name)")


def module_types(path: Path) -> list[str]:
    """The ``type`` of every module listed in ``path/modules.json``.

    Raises:
        ValueError: the file is not JSON, or not a list of ``{"type": ...}`` entries (named, with the fix).
    """
    file = path / "modules.json"
    try:
        entries = json.loads(file.read_text(encoding="utf-8"))
        if not isinstance(entries, list) or not entries:
            raise TypeError("not a non-empty list of modules")
        types = [entry["type"] for entry in entries]
        if not all(isinstance(name, str) for name in types):
            raise TypeError("a module's type is not a class name")
    except (ValueError, TypeError, KeyError, UnicodeDecodeError) as exc:
        reason = f"no {exc}" if isinstance(exc, KeyError) else str(exc).splitlines()[0]
        raise ValueError(f"{file} is damaged ({reason}): save the model again with model.save(path)") from None
    return types


def saved_model_dir(name_or_path: str | Path) -> Path | None:
    """The folder of a saved SentenceTransformer (one with ``modules.json``): ``name_or_path`` itself, or a Hub
    name's snapshot in the local Hugging Face cache (nothing is downloaded); ``None`` when it is not one."""
    local = Path(str(name_or_path)).expanduser()
    if local.is_dir():
        return local if (local / "modules.json").is_file() else None
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(str(name_or_path), "modules.json")
    except Exception:  # an id the Hub would refuse (e.g. two slashes) is not in the cache either
        return None
    return Path(cached).parent if isinstance(cached, str) else None
