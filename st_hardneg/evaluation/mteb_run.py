"""Running MTEB (the real ``mteb`` package, its own evaluators) on the local tasks of
:mod:`st_hardneg.evaluation.mteb_tasks` and on official MTEB tasks, and the results table.

Official task names (``STSBenchmark``, ``SICK-R``, any official retrieval task …) are looked up with
``mteb.get_tasks`` and need the Hugging Face Hub to fetch their data; without it the error names the local
equivalents. ``mteb`` is imported lazily.
"""

from __future__ import annotations

import os
import random
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from st_hardneg.evaluation.encoding import encode_unique, full_length, parse_task_list
from st_hardneg.evaluation.mteb_tasks import (
    LOCAL_MTEB_TASKS,
    LOCAL_RETRIEVAL_TASKS,
    LOCAL_TEST_TASKS,
    MTEBOfflineError,
    local_equivalents_message,
    local_task,
    require_mteb,
)
from st_hardneg.evaluation.retrieval import at_length, encode_at_length
from st_hardneg.reporting import markdown_table

if TYPE_CHECKING:
    from mteb.abstasks.abstask import AbsTask
    from mteb.abstasks.task_metadata import TaskMetadata
    from mteb.models import ModelMeta, SentenceTransformerEncoderWrapper
    from mteb.types import Array, BatchedInput, PromptType
    from sentence_transformers import SentenceTransformer
    from torch.utils.data import DataLoader


def _encoder_class() -> Callable[[SentenceTransformer, ModelMeta, dict[str, Any], int, bool],
                                  SentenceTransformerEncoderWrapper]:
    require_mteb()
    from mteb.models import SentenceTransformerEncoderWrapper

    class _Encoder(SentenceTransformerEncoderWrapper):
        """mteb's SentenceTransformer wrapper; for local STS tasks without a prompt, each distinct sentence of the
        task is encoded once (as :func:`evaluate_sts` does) and the embeddings are handed to mteb in float64, so that
        mteb's cosine is computed in the same precision as :func:`~st_hardneg.evaluation.cosine_spearman`. Retrieval
        tasks (queries and documents, with their prompts) go through mteb's own encoding."""

        def __init__(self, model: SentenceTransformer, meta: ModelMeta, local_tasks: dict[str, Any], batch_size: int,
                     show_progress_bar: bool) -> None:
            super().__init__(model)
            self.mteb_model_meta = meta
            self._local_tasks = local_tasks
            self._tables: dict[str, dict[str, np.ndarray]] = {}
            self._batch_size = batch_size
            self._show_progress_bar = show_progress_bar

        def encode(self, inputs: DataLoader[BatchedInput], *, task_metadata: TaskMetadata, hf_split: str,
                   hf_subset: str, prompt_type: PromptType | None = None, **kwargs: Any) -> Array:
            name = task_metadata.name
            task = self._local_tasks.get(name)
            if task is None or prompt_type is not None or self.get_prompt_name(task_metadata, prompt_type):
                # mteb's own path (encode_query / encode_document, the model's prompts); a local retrieval task at
                # its length (MRPC: the model's full length, BEIR folders: 256 tokens)
                length = getattr(task, "max_seq_length", None) if task is not None else None
                context = full_length(self.model) if task is not None and length is None else \
                    at_length(self.model, length)
                with context:
                    return super().encode(inputs, task_metadata=task_metadata, hf_split=hf_split,
                                          hf_subset=hf_subset, prompt_type=prompt_type, **kwargs)
            if name not in self._tables:
                task = self._local_tasks[name]
                length = getattr(task, "max_seq_length", None)
                if length is None:
                    table = encode_unique(self.model, task.sentences(), batch_size=self._batch_size,
                                          show_progress_bar=self._show_progress_bar)
                else:  # a fixed length (BEIR folders: the model's MTEB length), not the full one
                    table = encode_at_length(self.model, task.sentences(), length, batch_size=self._batch_size,
                                             show_progress_bar=self._show_progress_bar)
                self._tables = {name: table}
            table = self._tables[name]
            texts = [text for batch in inputs for text in batch["text"]]
            dtype = getattr(self._local_tasks[name], "embedding_dtype", np.float64)
            return np.stack([table[t] for t in texts]).astype(dtype)

    return _Encoder


def _model_meta(model: SentenceTransformer, model_name: str | None, revision: str | None = None,
                known: Mapping[str, Any] | None = None) -> ModelMeta:
    """mteb's metadata of ``model``: what ``ModelMeta.from_sentence_transformer_model`` reads, the name and revision
    results are filed under, ``n_parameters`` counted, and what an st-hardneg run saved (``known``, its
    ``model_meta.json``: ``adapted_from``, ``training_datasets``)."""
    from mteb.models import ModelMeta

    from st_hardneg.models import count_parameters, mteb_model_name, weights_digest

    meta = ModelMeta.from_sentence_transformer_model(model)
    known = dict(known or {})
    card = getattr(model, "model_card_data", None)
    base = known.get("adapted_from") or getattr(card, "base_model", None)
    name = mteb_model_name(model_name or known.get("name") or getattr(card, "model_name", None) or "local/model")
    update: dict[str, Any] = {"name": name, "revision": revision or f"weights-{weights_digest(model)}",
                              "n_parameters": count_parameters(model)}
    if base:
        update["adapted_from"] = str(base)
    if known.get("training_datasets"):
        update["training_datasets"] = set(map(str, known["training_datasets"]))
    return meta.model_copy(update=update)


def _parse_tasks(tasks: Sequence[str] | str) -> list[str]:
    names: list[str] = []
    for task in parse_task_list(tasks, None, "MTEB"):
        names.extend(LOCAL_TEST_TASKS if task == "local" else [task])
    if not names:
        raise ValueError(f"no MTEB task given; choose local tasks ({', '.join(LOCAL_MTEB_TASKS)}, or 'local') "
                         "or official MTEB task names")
    return list(dict.fromkeys(names))


def _hub_offline() -> bool:
    truthy = ("1", "on", "yes", "true")
    if any(os.environ.get(var, "").strip().lower() in truthy for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")):
        return True
    try:
        from huggingface_hub import constants

        return bool(constants.HF_HUB_OFFLINE)
    except ImportError:  # pragma: no cover - huggingface_hub ships with transformers
        return False


def _official_tasks(names: list[str]) -> list:
    """``mteb.get_tasks`` for the official names, with their data loaded (so a missing network fails here, early)."""
    import mteb

    try:
        tasks = list(mteb.get_tasks(tasks=names))
    except KeyError as exc:
        raise ValueError(
            f"unknown MTEB task(s) among {names}: {exc}. Official names are those of mteb.get_tasks(); "
            + local_equivalents_message(names)
        ) from None
    if _hub_offline():
        raise MTEBOfflineError(
            f"The official MTEB task(s) {', '.join(names)} download their data from the Hugging Face Hub, but the "
            "Hub is in offline mode (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE). " + local_equivalents_message(names)
        )
    for task in tasks:
        try:
            task.load_data()
        except Exception as exc:
            raise MTEBOfflineError(
                f"Could not load the data of the official MTEB task {task.metadata.name} (it is downloaded from the "
                f"Hugging Face Hub; is there a network?): {type(exc).__name__}: {exc}. "
                + local_equivalents_message(names)
            ) from exc
    return tasks


@contextmanager
def _preserved_rng() -> Iterator[None]:
    """mteb seeds ``random``, numpy and torch globally whenever a task is created; undo that for the caller."""
    import torch

    state = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    try:
        yield
    finally:
        random.setstate(state[0])
        np.random.set_state(state[1])
        torch.set_rng_state(state[2])


def run_mteb(
    model: SentenceTransformer,
    tasks: Sequence[str | AbsTask] | str,
    data_dir: str | Path | None = None,
    output_dir: str | Path | None = None,
    *,
    model_name: str | None = None,
    revision: str | None = None,
    batch_size: int = 64,
    use_cache: bool = False,
    show_progress_bar: bool = True,
    known_meta: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Run MTEB (the real ``mteb`` package, its own evaluators) on local SentEval STS tasks and/or official tasks.

    - Local tasks (``STS12-local`` … ``STS16-local``, ``STSBenchmark-local``, ``SICK-R-local``,
      ``STSBenchmark-dev-local``; ``"local"`` = the seven test sets) read the SentEval files and run offline. Each
      distinct sentence of a task is encoded once at the model's full length, exactly as
      ``evaluate_sts(model, data_dir, tasks=[that set])`` encodes it, and mteb's main score (cosine Spearman)
      equals that score to < 1e-6 (tested on STS-B; measured 0 on STS-B and SICK-R, ≤ 5e-7 on STS13–16 with
      all-MiniLM-L6-v2). STS12 differs by ~0.003: its 61 pairs of identical sentences get a cosine of exactly 1 in
      mteb (a tie, averaged ranks) but 1 ± 1 ulp in ``cosine_spearman`` (and SentEval), whose rounding noise
      breaks the tie.
    - ``MRPC-retrieval-local`` (:func:`local_retrieval_task`) is a local retrieval task (MRPC paraphrase
      retrieval, main score nDCG@10), scored by mteb's retrieval evaluator on the float32 embeddings that
      :func:`~st_hardneg.evaluation.evaluate_retrieval` ranks: nDCG@10 and MRR@10 equal that function's to < 1e-6
      (tested; measured 0 with all-MiniLM-L6-v2, mean pooling).
    - Official names (``STSBenchmark``, ``STS12``, ``SICK-R``, any retrieval task …) go through ``mteb.get_tasks``
      and need a network for their data. Without one (or with ``HF_HUB_OFFLINE=1``) this fails with
      :class:`MTEBOfflineError` naming the local equivalents, before any encoding.
    - mteb's result cache is bypassed unless ``use_cache=True``: its default cache would return stale scores for
      an unnamed local model. With it, a cached result whose dataset revision is not the task's is recomputed: a
      local task's revision is the digest of its files (:func:`~st_hardneg.evaluation.mteb_tasks.content_revision`),
      so a BEIR folder or SentEval file with the same task name but other contents is never answered from the
      cache (mteb's ``only-missing`` would). Results are named after the model: ``model_name``, else the name in
      ``known_meta``, else the model card's ``model_name``, else ``local/model``; the revision is ``revision``, else
      a digest of the weights
      (``weights-<sha256[:12]>``), so result files are traceable and a cache can never mix two checkpoints.
    - Retrieval tasks are encoded by mteb itself (``encode_query`` / ``encode_document`` with the model's prompts,
      as ``mteb.evaluate(model, task)``); local STS tasks without a prompt use each distinct sentence once. Lengths:
      local STS and MRPC tasks at the model's full length (the training ``max_seq_length`` lifted), BEIR folders at
      their task's ``max_seq_length`` (256), official tasks at the model's own ``max_seq_length`` (as mteb). The
      global ``random`` / numpy / torch RNG states (which mteb reseeds when it builds tasks) are restored
      afterwards.

    Args:
        model: a SentenceTransformer.
        tasks: task names (list or comma-separated string), local and/or official.
        data_dir: the SentEval directory for local tasks (see :func:`st_hardneg.data.senteval.resolve_senteval_dir`).
        output_dir: if given, mteb writes its result files there (``results/<model>/<revision>/<task>.json`` and
            ``model_meta.json``); existing files are overwritten unless ``use_cache=True``.
        model_name: name recorded in the results (``org/name``; ``local/`` is prepended when there is no ``/``).
        revision: the revision recorded (default: ``weights-<digest of the weights>``).
        batch_size: encoding batch size.
        use_cache: reuse results already in ``output_dir`` (or in mteb's default cache ``$MTEB_CACHE`` /
            ``~/.cache/mteb`` when ``output_dir`` is None) instead of recomputing them.
        show_progress_bar: show mteb's and the encoding progress bars.
        known_meta: what is known of the model beyond the model itself, mteb's ``ModelMeta`` fields (the
            ``model_meta.json`` an st-hardneg run saves beside its model: ``name``, ``adapted_from``,
            ``training_datasets``); ``n_parameters`` is always counted.

    Returns:
        ``{"model": name, "revision": revision, "scores": {task: main score x 100}, "main_score": {task: metric
        name}, "avg": mean of the scores}``. Scores are mteb's main score on the test split (mean over splits
        and subsets when a task has several), x 100 like :func:`~st_hardneg.evaluation.evaluate_sts`.

    Raises:
        ImportError: the optional ``mteb`` package is not installed (``pip install 'st-hardneg[mteb]'``).
        ValueError: an unknown task name (the message lists the local tasks).
        MTEBOfflineError: an official task's data cannot be downloaded.
        DataNotFoundError: a local task's SentEval files are missing.

    Example:
        ::

            from st_hardneg.evaluation import run_mteb, format_mteb_table
            from st_hardneg.models import load_default_model

            model = load_default_model()
            result = run_mteb(model, "local", data_dir="path/to/senteval", output_dir="mteb-results")
            print(format_mteb_table({"MiniLM (CLS)": result}))
    """
    mteb = require_mteb()
    from mteb.cache import ResultCache

    given: dict[str, AbsTask] = {}
    if not isinstance(tasks, str):
        given = {task.metadata.name: task for task in tasks if not isinstance(task, str)}
    names = _parse_tasks(tasks if isinstance(tasks, str) else
                         [task if isinstance(task, str) else task.metadata.name for task in tasks])
    local_names = [n for n in names if n in LOCAL_MTEB_TASKS or n in LOCAL_RETRIEVAL_TASKS or n in given]
    official_names = [n for n in names if n not in local_names]
    was_training = getattr(model, "training", False)
    with _preserved_rng():
        official = _official_tasks(official_names) if official_names else []
        local = {name: given[name] if name in given else local_task(name, data_dir) for name in local_names}
        by_name = {**local, **{task.metadata.name: task for task in official}}
        ordered = [by_name[n] for n in names if n in by_name]
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*get_sentence_embedding_dimension", category=FutureWarning)
            meta = _model_meta(model, model_name, revision, known_meta)
            encoder = _encoder_class()(model, meta, local, batch_size, show_progress_bar)
        cache_obj: ResultCache | None
        if output_dir is not None:
            cache_obj = ResultCache(Path(output_dir))
        else:
            cache_obj = ResultCache() if use_cache else None
        try:
            with warnings.catch_warnings():
                # mteb 2.x still calls ST's renamed get_sentence_embedding_dimension (a FutureWarning per task)
                warnings.filterwarnings("ignore", message=".*get_sentence_embedding_dimension", category=FutureWarning)
                stale = _stale_in_cache(cache_obj, ordered, meta) if use_cache and cache_obj is not None else set()
                results = []
                for strategy, group in (("always", [t for t in ordered if t.metadata.name in stale]),
                                        ("only-missing" if use_cache else "always",
                                         [t for t in ordered if t.metadata.name not in stale])):
                    if group:
                        results.append(mteb.evaluate(
                            encoder,
                            group,
                            cache=cache_obj,
                            overwrite_strategy=strategy,
                            encode_kwargs={"batch_size": batch_size, "show_progress_bar": show_progress_bar},
                            show_progress_bar=show_progress_bar,
                            co2_tracker=False,
                        ))
        finally:
            if was_training:
                model.train()
    failed = [error for result in results for error in result.exceptions]
    if failed:
        raise RuntimeError(f"mteb failed on: {failed}")
    scores: dict[str, float] = {}
    metrics: dict[str, str] = {}
    for task_result in (task_result for result in results for task_result in result.task_results):
        splits = ["test"] if "test" in task_result.scores else None
        scores[task_result.task_name] = 100.0 * float(task_result.get_score(splits=splits))
        metrics[task_result.task_name] = by_name[task_result.task_name].metadata.main_score
    scores = {n: scores[n] for n in names if n in scores}
    return {
        "model": meta.name,
        "revision": meta.revision,
        "scores": scores,
        "main_score": {n: metrics[n] for n in scores},
        "avg": float(np.mean(list(scores.values()))),
    }


def _stale_in_cache(cache: Any, tasks: Sequence[AbsTask], meta: Any) -> set[str]:
    """The tasks whose cached result was computed on other data: its recorded dataset revision differs from the
    task's (a local task's revision is the digest of its files,
    :func:`~st_hardneg.evaluation.mteb_tasks.content_revision`). mteb's ``only-missing`` would return such a result
    as it is; these are recomputed."""
    stale: set[str] = set()
    for task in tasks:
        try:
            cached = cache.load_task_result(task.metadata.name, meta)
        except Exception:  # an unreadable cached file: mteb's own strategy decides
            continue
        if cached is not None and getattr(cached, "dataset_revision", None) != task.metadata.revision:
            stale.add(task.metadata.name)
    return stale


def format_mteb_table(rows: dict[str, dict[str, Any]], tasks: Sequence[str] | None = None) -> str:
    """A markdown table, one row per model: ``{name: run_mteb(...) result}`` (scores x 100, then their mean)."""
    if not rows:
        return ""
    if tasks is None:
        tasks = list(dict.fromkeys(t for row in rows.values() for t in row["scores"]))
    header = ["model", *tasks, "avg"]
    body = []
    for name, row in rows.items():
        cells = [f"{row['scores'][t]:.2f}" if t in row["scores"] else "–" for t in tasks]
        body.append([name, *cells, f"{row['avg']:.2f}"])
    return markdown_table(header, body).rstrip("\n")
