"""What ``st-hardneg eval`` computes into a results folder that may already hold an ``eval.json``.

An ``eval.json`` is read back as *input*: :func:`read_eval_record` checks every field a rerun uses (its types, and
that the side files it names lie inside its folder) and refuses the file in one line naming it and the key, never
with a traceback. Each result in it is recorded with the settings it was computed with (:func:`eval_settings`):
the model's modules, the digest of its weights and the revision it is filed under, and the *content* of the data
(the SHA-256 of a BEIR folder's files, of the SentEval STS files, a local mteb task's dataset revision), not only
their paths. :func:`plan_eval` compares a request with that record:

- a result recorded with the same settings is reused (skipped);
- a missing one is computed;
- one recorded with other settings (other data in the folder, another ``--revision``, other weights, an older
  ``eval.json`` that recorded none) is refused, since computing it would replace it, unless ``overwrite``;
- with ``overwrite``, the requested results are recomputed and the others kept, except those computed with other
  weights, which are dropped (the file names one model) and listed in :attr:`EvalPlan.dropped`.

Example:
    ::

        from st_hardneg.evaluation.planning import eval_settings, plan_eval, read_eval_record

        previous = read_eval_record("results/st-hardneg/local__run/weights-0123abcd4567/eval.json")
        settings = eval_settings(["sts"], modules="Transformer(BertModel, 512 tokens) -> Pooling(mean)",
                                 weights="0123abcd4567", revision="weights-0123abcd4567", senteval_dir=None)
        plan = plan_eval(previous, settings, "results/.../eval.json")
        plan.groups, plan.skipped
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["EvalPlan", "EvalRecordError", "eval_settings", "merge_mteb", "merged_settings", "plan_eval",
           "read_eval_record", "record_file", "senteval_digest"]

#: the groups whose results are kept per task (``{group: {task: result}}``); the others hold one result each
PER_TASK_GROUPS = ("beir", "mteb")
#: the result groups an ``eval.json`` may hold
RESULT_GROUPS = ("sts", "transfer", "mteb", "align", "beir")


class EvalRecordError(ValueError):
    """An ``eval.json`` that cannot be trusted as written: the message names the file and the key."""


def _fail(path: Path, key: str, problem: str) -> EvalRecordError:
    return EvalRecordError(f"{path}: {key} {problem}; fix it or pass --overwrite to replace the file")


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def record_file(path: str | Path, key: str, name: Any) -> str:
    """A side file an ``eval.json`` names (``files.per_query``, ``files.runs.<task>``): a plain file name, which
    lies beside the record in its folder; returns it.

    Raises:
        EvalRecordError: not a string, empty, a path with a folder part, ``..`` or an absolute path.
    """
    if not isinstance(name, str) or not name.strip():
        raise _fail(Path(path), key, f"must name a file beside it, got {name!r}")
    if name in (".", "..") or Path(name).name != name or "\\" in name or Path(name).is_absolute():
        raise _fail(Path(path), key, f"must name a file in the record's own folder, got {name!r} (no folder, '..' "
                                     "or absolute path is followed)")
    return name


def read_eval_record(path: str | Path) -> dict[str, Any]:
    """An existing ``eval.json``, checked field by field before anything in it is used.

    Checked: the file is UTF-8 JSON holding an object; ``files`` is a mapping whose ``per_query`` is a plain file
    name (:func:`record_file`) and whose ``runs`` maps task names to plain file names; ``seconds`` is a finite
    number >= 0; ``settings`` is a mapping of mappings; the result groups (``sts``, ``transfer``, ``align``,
    ``beir``, ``mteb``) are mappings, each ``beir`` task a mapping of numbers (its ``data``, ``split`` and
    ``prompts`` aside), ``mteb.scores`` a mapping of numbers.

    Raises:
        EvalRecordError: the first field that is not what a rerun reads, named with the file.
    """
    path = Path(path)
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as error:
        raise EvalRecordError(f"{path} exists but cannot be read as an eval.json (not UTF-8 text: {error.reason}); "
                              "pass --overwrite to replace it") from None
    except json.JSONDecodeError as error:
        raise EvalRecordError(f"{path} exists but cannot be read as an eval.json (not JSON: {error.msg}, line "
                              f"{error.lineno}); pass --overwrite to replace it") from None
    except OSError as error:
        raise EvalRecordError(f"{path} exists but cannot be read ({error.strerror or error})") from None
    if not isinstance(record, dict):
        raise EvalRecordError(f"{path} exists but holds no eval.json object (a JSON {_kind(record)}); pass "
                              "--overwrite to replace it")
    files = record.get("files", {})
    if not isinstance(files, dict):
        raise _fail(path, "'files'", f"must be a mapping of file names, got {_kind(files)}")
    if files.get("per_query") is not None:
        record_file(path, "'files.per_query'", files["per_query"])
    runs = files.get("runs", {})
    if not isinstance(runs, dict):
        raise _fail(path, "'files.runs'", f"must map task names to TREC run files, got {_kind(runs)}")
    for task, name in runs.items():
        record_file(path, f"'files.runs.{task}'", name)
    if "seconds" in record:
        seconds = record["seconds"]
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not math.isfinite(seconds) \
                or seconds < 0:
            raise _fail(path, "'seconds'", f"must be a number of seconds >= 0, got {seconds!r}")
    settings = record.get("settings", {})
    if not isinstance(settings, dict):
        raise _fail(path, "'settings'", f"must be a mapping, got {_kind(settings)}")
    for group, value in settings.items():
        if not isinstance(value, dict):
            raise _fail(path, f"'settings.{group}'", f"must be a mapping, got {_kind(value)}")
    for group in RESULT_GROUPS:
        if group in record and not isinstance(record[group], dict):
            raise _fail(path, f"'{group}'", f"must be a mapping of results, got {_kind(record[group])}")
    for task, scores in record.get("beir", {}).items():
        if not isinstance(scores, dict):
            raise _fail(path, f"'beir.{task}'", f"must be a mapping of metrics, got {_kind(scores)}")
        for metric, value in scores.items():
            if metric in ("data", "split", "prompts"):
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise _fail(path, f"'beir.{task}.{metric}'", f"must be a finite number, got {value!r}")
    mteb = record.get("mteb", {})
    for key in ("scores", "main_score"):
        if key in mteb and not isinstance(mteb[key], dict):
            raise _fail(path, f"'mteb.{key}'", f"must be a mapping by task, got {_kind(mteb[key])}")
    for task, value in mteb.get("scores", {}).items():
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise _fail(path, f"'mteb.scores.{task}'", f"must be a finite number, got {value!r}")
    return record


def senteval_digest(root: str | Path | None, files: Sequence[str]) -> str | None:
    """SHA-256 (12 hex digits) of the SentEval files a group reads (relative to ``root``), in order; ``None`` when
    ``root`` is unknown or a file is missing (the group fails when it runs)."""
    if root is None:
        return None
    import hashlib

    digest = hashlib.sha256()
    for relative in files:
        file = Path(root) / relative
        if not file.is_file():
            return None
        digest.update(f"{relative}:{file.stat().st_size}:".encode())
        digest.update(file.read_bytes())
    return digest.hexdigest()[:12]


def eval_settings(groups: Sequence[str], *, modules: str, weights: str, revision: str,
                  senteval_dir: str | Path | None, sts_digest: str | None = None, fast: bool = False,
                  max_seq_length: int | None = None, beir: Sequence[tuple[str, str, str, str]] = (),
                  mteb: Sequence[tuple[str, str | None]] = (), query_prompt_name: str | None = None,
                  document_prompt_name: str | None = None) -> dict[str, Any]:
    """What each requested result depends on: the settings an earlier result must match to be reused.

    Args:
        groups: the requested groups (``sts``, ``transfer``, ``mteb``, ``align``, ``beir``).
        modules: the model's module line (:func:`st_hardneg.models.module_stack`).
        weights: the digest of the model's weights (:func:`st_hardneg.models.weights_digest`).
        revision: the revision the results are filed under (``--revision``, or ``weights-<digest>``).
        senteval_dir: the resolved SentEval directory (``None``: not found; the groups that need it fail later).
        sts_digest: the digest of the SentEval STS files (:func:`senteval_digest`), for ``sts`` and ``align``.
        fast: ``transfer``'s quick protocol.
        max_seq_length: the encoding length of ``beir`` and of ``mteb``'s BEIR folders.
        beir: ``(task name, folder, folder digest, split)`` per BEIR task.
        mteb: ``(task name, dataset revision)`` per mteb task (a local task's revision is the digest of its
            files, :func:`~st_hardneg.evaluation.mteb_tasks.content_revision`; ``None`` for an official task).
        query_prompt_name, document_prompt_name: ``beir``'s prompts.

    Returns:
        ``{group: settings}`` for ``sts`` / ``transfer`` / ``align``; ``{group: {task: settings}}`` for ``beir``
        and ``mteb``.
    """
    common = {"modules": modules, "weights": weights, "revision": revision,
              "data_dir": None if senteval_dir is None else str(senteval_dir)}
    settings: dict[str, Any] = {}
    for group in groups:
        if group in ("sts", "align"):
            settings[group] = {**common, "data_digest": sts_digest}
        elif group == "transfer":
            settings[group] = {**common, "fast": bool(fast)}
        elif group == "mteb":
            settings["mteb"] = {name: {**common, "max_seq_length": max_seq_length, "dataset_revision": dataset}
                                for name, dataset in mteb}
        elif group == "beir":
            settings["beir"] = {name: {"modules": modules, "weights": weights, "revision": revision, "data": folder,
                                       "data_digest": digest, "split": split, "max_seq_length": max_seq_length,
                                       "query_prompt_name": query_prompt_name,
                                       "document_prompt_name": document_prompt_name}
                                for name, folder, digest, split in beir}
    return settings


@dataclass
class EvalPlan:
    """What ``eval`` computes into an existing record.

    Attributes:
        groups: the groups with anything to compute, in the requested order.
        beir, mteb: the task names of those groups to compute.
        skipped: the results reused from the record (``"sts"``, ``"beir <task>"``, ``"mteb <task>"``).
        dropped: the results removed from the record with ``overwrite`` because other weights computed them.
        record: the earlier record without the dropped results: what the new one starts from.
    """

    groups: list[str] = field(default_factory=list)
    beir: set[str] = field(default_factory=set)
    mteb: set[str] = field(default_factory=set)
    skipped: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    record: dict[str, Any] = field(default_factory=dict)


def _recorded(previous: Mapping[str, Any]) -> dict[tuple[str, str | None], Any]:
    """Every result of a record, keyed ``(group, task)`` (``task`` ``None`` for a group of one result), with its
    recorded settings (``None``: none recorded)."""
    before = previous.get("settings", {})
    out: dict[tuple[str, str | None], Any] = {}
    for group in RESULT_GROUPS:
        if group not in previous:
            continue
        recorded = before.get(group)
        if group == "beir":
            for task in previous["beir"]:
                out["beir", task] = recorded.get(task) if isinstance(recorded, dict) else None
        elif group == "mteb":
            for task in previous["mteb"].get("scores", {}):
                entry = recorded.get(task) if isinstance(recorded, dict) else None
                out["mteb", task] = entry if isinstance(entry, dict) and "weights" in entry else None
        else:
            out[group, None] = recorded
    return out


def _label(group: str, task: str | None) -> str:
    return group if task is None else f"{group} {task}"


def plan_eval(previous: Mapping[str, Any], settings: Mapping[str, Any], path: str | Path,
              overwrite: bool = False) -> EvalPlan:
    """Compare the request's ``settings`` (:func:`eval_settings`) with an earlier record (``previous``, checked by
    :func:`read_eval_record`; empty: none) and say what to compute (module docstring).

    Raises:
        ValueError: without ``overwrite``, a requested result recorded with other settings, or a result of other
            weights in the record (the file would mix two models); the message names the file, the results and
            what differs.
    """
    requested: dict[tuple[str, str | None], Any] = {}
    for group, wanted in settings.items():
        if group in PER_TASK_GROUPS:
            requested.update({(group, task): task_settings for task, task_settings in wanted.items()})
        else:
            requested[group, None] = wanted
    weights = next((s.get("weights") for s in requested.values() if isinstance(s, dict)), None)
    plan = EvalPlan(record={k: (dict(v) if isinstance(v, dict) else v) for k, v in previous.items()})
    conflicts: list[str] = []
    todo: set[tuple[str, str | None]] = set()
    for key, recorded in _recorded(previous).items():
        label = _label(*key)
        other_weights = isinstance(recorded, dict) and "weights" in recorded and recorded["weights"] != weights
        if key in requested:
            if overwrite or recorded != requested[key]:
                if not overwrite:
                    conflicts.append(label + _differs(recorded, requested[key]))
                todo.add(key)
            else:
                plan.skipped.append(label)
        elif other_weights:
            if overwrite:
                plan.dropped.append(label)
                _drop(plan.record, key)
            else:
                conflicts.append(f"{label} computed with other weights ({recorded['weights']}, now {weights})")
    if conflicts:
        raise ValueError(f"{path} exists and holds {'; '.join(conflicts)}; pass --overwrite to recompute (the other "
                         "results are kept), or write elsewhere")
    recorded_keys = set(_recorded(previous))
    todo |= {key for key in requested if key not in recorded_keys}
    for group in settings:
        keys = [key for key in todo if key[0] == group]
        if not keys:
            continue
        plan.groups.append(group)
        if group == "beir":
            plan.beir = {str(task) for _, task in keys}
        elif group == "mteb":
            plan.mteb = {str(task) for _, task in keys}
    return plan


def _drop(record: dict[str, Any], key: tuple[str, str | None]) -> None:
    """Remove one result (and its settings, its per-query file entry) from a record, in place."""
    group, task = key
    settings = record.get("settings")
    if task is None:
        record.pop(group, None)
        if isinstance(settings, dict):
            settings.pop(group, None)
        return
    if group == "beir":
        record["beir"] = {t: v for t, v in record["beir"].items() if t != task}
        files = record.get("files")
        if isinstance(files, dict) and isinstance(files.get("runs"), dict):
            files["runs"] = {t: v for t, v in files["runs"].items() if t != task}
    else:
        mteb = dict(record["mteb"])
        for part in ("scores", "main_score"):
            if isinstance(mteb.get(part), dict):
                mteb[part] = {t: v for t, v in mteb[part].items() if t != task}
        record["mteb"] = mteb
    if isinstance(settings, dict) and isinstance(settings.get(group), dict):
        settings[group] = {t: v for t, v in settings[group].items() if t != task}


def _differs(recorded: Any, wanted: Mapping[str, Any]) -> str:
    if not isinstance(recorded, dict):
        return " without its settings (an older eval.json)"
    keys = [k for k in wanted if recorded.get(k) != wanted[k]]
    if not keys:
        return ""
    return " with other settings (" + ", ".join(f"{k} {recorded.get(k)!r}, now {wanted[k]!r}" for k in keys) + ")"


def merged_settings(record: Mapping[str, Any], settings: Mapping[str, Any]) -> dict[str, Any]:
    """The settings a new record holds: the earlier record's (``plan.record``), with this run's groups and tasks
    set (a reused result's settings are equal by :func:`plan_eval`)."""
    merged = {k: dict(v) for k, v in record.get("settings", {}).items() if isinstance(v, dict)}
    for group, wanted in settings.items():
        if group in PER_TASK_GROUPS:
            earlier = merged.get(group, {})
            if group == "mteb":  # an older record's group-wide form ({"tasks": [...], ...}) is replaced
                earlier = {t: v for t, v in earlier.items() if isinstance(v, dict) and "weights" in v}
            merged[group] = {**earlier, **wanted}
        else:
            merged[group] = dict(wanted)
    return merged


def merge_mteb(earlier: Mapping[str, Any] | None, ran: Mapping[str, Any]) -> dict[str, Any]:
    """mteb's scores of an earlier run and this one, by task (this run's win); ``avg`` over all of them."""
    if not earlier or not earlier.get("scores"):
        return dict(ran)
    import numpy as np

    scores = {**earlier.get("scores", {}), **ran["scores"]}
    main_score = {**earlier.get("main_score", {}), **ran["main_score"]}
    return {**ran, "scores": scores, "main_score": main_score, "avg": float(np.mean(list(scores.values())))}
