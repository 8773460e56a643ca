"""MTEB on the real ``mteb`` package: the local SentEval STS sets as mteb STS tasks, a local retrieval task (MRPC
paraphrase retrieval, :mod:`st_hardneg.retrieval_data`), plus official MTEB tasks.

The local tasks (``STS12-local`` … ``SICK-R-local``) are subclasses of mteb's ``AbsTaskSTS`` whose ``load_data``
reads the SentEval files with :func:`st_hardneg.data.read_sts_pairs`, so mteb's own STS evaluator scores them with
no network. Official task names (``STSBenchmark``, ``SICK-R``, any official retrieval task …) are looked up with
``mteb.get_tasks`` and need the Hugging Face Hub to fetch their data.

``mteb`` is imported lazily (it takes seconds to import), so ``import st_hardneg.evaluation`` stays fast.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import warnings
from collections.abc import Sequence
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from st_hardneg.data import STS_YEAR_SUBSETS, check_sts_data, read_sts_pairs, resolve_senteval_dir, sts_files
from st_hardneg.evaluation.encoding import encode_unique, full_length
from st_hardneg.reporting import markdown_table

logger = logging.getLogger(__name__)

#: local mteb task name -> SentEval STS task of :func:`st_hardneg.data.read_sts_pairs`
LOCAL_MTEB_TASKS: dict[str, str] = {
    "STS12-local": "STS12",
    "STS13-local": "STS13",
    "STS14-local": "STS14",
    "STS15-local": "STS15",
    "STS16-local": "STS16",
    "STSBenchmark-local": "STSBenchmark",
    "SICK-R-local": "SICKRelatedness",
    "STSBenchmark-dev-local": "STSBenchmark-dev",
}
#: the seven test sets (``tasks="local"``), in the order of the papers' STS tables
LOCAL_TEST_TASKS = tuple(name for name in LOCAL_MTEB_TASKS if name != "STSBenchmark-dev-local")
#: official MTEB task name -> its local equivalent (same pairs, except SICK-R: MTEB scores all 9,927 SICK pairs,
#: the local task the 4,927 test pairs that SentEval and the papers use)
OFFICIAL_TO_LOCAL: dict[str, str] = {
    "STS12": "STS12-local",
    "STS13": "STS13-local",
    "STS14": "STS14-local",
    "STS15": "STS15-local",
    "STS16": "STS16-local",
    "STSBenchmark": "STSBenchmark-local",
    "STSBenchmark.v2": "STSBenchmark-local",
    "SICK-R": "SICK-R-local",
}
#: local mteb retrieval task name -> task of :mod:`st_hardneg.retrieval_data` (built from the SentEval MRPC files)
LOCAL_RETRIEVAL_TASKS: dict[str, str] = {
    "MRPC-retrieval-local": "MRPC",
}
_SCORE_RANGE = {"SICKRelatedness": (1, 5)}  # gold scale (only mteb's linear normalisation uses it)


class MTEBOfflineError(RuntimeError):
    """An official MTEB task could not get its data (no network / Hub offline); the message names the local tasks."""


def _local_equivalents_message(names: Sequence[str]) -> str:
    pairs = [f"{name} -> {OFFICIAL_TO_LOCAL[name]}" for name in names if name in OFFICIAL_TO_LOCAL]
    text = "Local equivalents that run offline on the SentEval files: "
    text += "; ".join(pairs) + ". " if pairs else ""
    text += f"All local tasks: {', '.join([*LOCAL_MTEB_TASKS, *LOCAL_RETRIEVAL_TASKS])} (or tasks='local' for the "
    text += "seven STS test sets)."
    return text


def require_mteb():
    """The ``mteb`` module, or an ImportError saying how to install it (it is the optional ``[mteb]`` extra)."""
    try:
        import mteb
    except ImportError as exc:
        raise ImportError(
            "MTEB evaluation needs the optional 'mteb' package: pip install 'st-hardneg[mteb]'"
        ) from exc
    return mteb


@cache
def _local_task_base():
    require_mteb()
    from datasets import Dataset, DatasetDict
    from mteb.abstasks.sts import AbsTaskSTS

    class SentEvalSTSTask(AbsTaskSTS):
        """A SentEval STS set as an mteb STS task (test split, one ``default`` subset, cosine Spearman).

        Concrete tasks are subclasses made by :func:`local_sts_task`, with ``metadata``, ``sts_task`` and ``root``
        as class attributes (mteb restores the class-level ``metadata`` when it unloads a task's data).
        """

        sts_task: str
        root: Path

        def load_data(self, num_proc: int | None = None, **kwargs: Any) -> None:
            if self.data_loaded:
                return
            s1, s2, gold = read_sts_pairs(self.root, self.sts_task)
            self.dataset = {"default": DatasetDict(
                {"test": Dataset.from_dict({"sentence1": s1, "sentence2": s2, "score": gold})}
            )}
            self.data_loaded = True

        def sentences(self) -> list[str]:
            """Every sentence of the task in :func:`~st_hardneg.evaluation.evaluate_sts`'s order (all first
            sentences, then all second sentences)."""
            s1, s2, _ = read_sts_pairs(self.root, self.sts_task)
            return [*s1, *s2]

    return SentEvalSTSTask


def local_sts_task(name: str, data_dir: str | Path | None = None):
    """A local SentEval STS set as an mteb task (a subclass of ``mteb.abstasks.sts.AbsTaskSTS``).

    Args:
        name: one of :data:`LOCAL_MTEB_TASKS` (``STS12-local`` … ``STSBenchmark-local``, ``SICK-R-local``,
            ``STSBenchmark-dev-local``).
        data_dir: the SentEval directory (see :func:`st_hardneg.data.resolve_senteval_dir`).

    Raises:
        ValueError: an unknown name.
        DataNotFoundError: the task's files are missing.

    Example:
        ::

            import mteb
            from st_hardneg.evaluation import local_sts_task

            task = local_sts_task("STSBenchmark-local", "path/to/senteval")
            result = mteb.evaluate(model, task, cache=None)
    """
    require_mteb()
    from mteb.abstasks.task_metadata import TaskMetadata

    if name not in LOCAL_MTEB_TASKS:
        raise ValueError(f"unknown local MTEB task {name!r}; choose from {', '.join(LOCAL_MTEB_TASKS)}")
    sts_task = LOCAL_MTEB_TASKS[name]
    root = resolve_senteval_dir(data_dir)
    check_sts_data(root, [sts_task])
    subsets = STS_YEAR_SUBSETS.get(sts_task)
    official = [o for o, local in OFFICIAL_TO_LOCAL.items() if local == name]
    min_score, max_score = _SCORE_RANGE.get(sts_task, (0, 5))
    metadata = TaskMetadata(
        name=name,
        dataset={"path": str((root / sts_files(sts_task)[0]).parent), "revision": "local"},
        description=(
            f"{sts_task} read from the local SentEval directory exactly as SentEval / SimCSE read it"
            + (f" (all scored pairs of {', '.join(subsets)} pooled)" if subsets else "")
            + "; scored by mteb's STS evaluator (main score: cosine Spearman)."
        ),
        reference="https://github.com/facebookresearch/SentEval",
        type="STS",
        category="t2t",
        modalities=["text"],
        eval_splits=["test"],
        eval_langs=["eng-Latn"],
        main_score="cosine_spearman",
        license="not specified",
        annotations_creators="human-annotated",
        dialect=[],
        sample_creation="found",
        bibtex_citation="",
        adapted_from=official or None,
    )
    attributes = {"metadata": metadata, "sts_task": sts_task, "root": root, "min_score": min_score,
                  "max_score": max_score}
    cls = type(name.replace("-", "_").replace(".", "_"), (_local_task_base(),), attributes)
    return cls()


@cache
def _local_retrieval_base():
    from datasets import Dataset
    from mteb.abstasks.retrieval import AbsTaskRetrieval

    class LocalRetrievalTask(AbsTaskRetrieval):
        """A local retrieval task of :mod:`st_hardneg.retrieval_data` as an mteb retrieval task (test split).

        Concrete tasks are subclasses made by :func:`local_retrieval_task`, with ``metadata``, ``retrieval_task``
        and ``root`` as class attributes. The embeddings are handed to mteb in float32, the precision in which
        sentence-transformers' ``InformationRetrievalEvaluator`` scores them, so both rank the corpus identically.
        """

        retrieval_task: str
        root: Path
        embedding_dtype = np.float32
        k_values = (1, 3, 5, 10, 20, 100, 1000)

        def _task(self):
            from st_hardneg.retrieval_data import build_retrieval_task

            return build_retrieval_task(self.retrieval_task, self.root)

        def load_data(self, num_proc: int | None = None, **kwargs: Any) -> None:
            if self.data_loaded:
                return
            task = self._task()
            queries = [q for q in task.queries if task.relevant_docs.get(q)]
            self.dataset = {"default": {"test": {
                "queries": Dataset.from_dict({"id": queries, "text": [task.queries[q] for q in queries]}),
                "corpus": Dataset.from_dict({"id": list(task.corpus), "text": list(task.corpus.values()),
                                             "title": [""] * len(task.corpus)}),
                "relevant_docs": {q: {d: 1 for d in sorted(task.relevant_docs[q])} for q in queries},
                "top_ranked": None,
            }}}
            self.data_loaded = True

        def task_specific_scores(self, scores, qrels, results, hf_split, hf_subset):
            # mteb rounds its nDCG, MAP, recall and precision means to 5 decimals; report the unrounded means of
            # the same per-query pytrec_eval values, so the scores compare to the sentence-transformers evaluator
            # beyond 1e-5 (MRR is not rounded by mteb).
            out = {}
            for k in self.k_values:
                for metric, name in (("ndcg_cut", "ndcg_at"), ("recall", "recall_at"), ("map_cut", "map_at"),
                                     ("P", "precision_at")):
                    values = [per_query[f"{metric}_{k}"] for per_query in scores.values()]
                    out[f"{name}_{k}"] = float(np.mean(values))
            return out

        def sentences(self) -> list[str]:
            """Every text of the task in the order the evaluator encodes them (queries, then documents)."""
            task = self._task()
            return [*(task.queries[q] for q in task.queries if task.relevant_docs.get(q)), *task.corpus.values()]

    return LocalRetrievalTask


def local_retrieval_task(name: str, data_dir: str | Path | None = None):
    """A local retrieval task as an mteb task (a subclass of ``mteb.abstasks.retrieval.AbsTaskRetrieval``).

    ``MRPC-retrieval-local`` is MRPC paraphrase retrieval (:func:`st_hardneg.retrieval_data.build_mrpc_retrieval`):
    main score nDCG@10. Scored by mteb's retrieval evaluator, it equals
    :func:`~st_hardneg.evaluation.evaluate_retrieval` (sentence-transformers' ``InformationRetrievalEvaluator``)
    for nDCG@10 and MRR@10.

    Args:
        name: one of :data:`LOCAL_RETRIEVAL_TASKS`.
        data_dir: the SentEval directory (see :func:`st_hardneg.data.resolve_senteval_dir`).

    Raises:
        ValueError: an unknown name.
        DataNotFoundError: the task's files are missing.
    """
    from mteb.abstasks.task_metadata import TaskMetadata

    from st_hardneg.retrieval_data import retrieval_task_files, senteval_root

    if name not in LOCAL_RETRIEVAL_TASKS:
        raise ValueError(f"unknown local retrieval task {name!r}; choose from {', '.join(LOCAL_RETRIEVAL_TASKS)}")
    retrieval_task = LOCAL_RETRIEVAL_TASKS[name]
    root = senteval_root(data_dir)
    files = retrieval_task_files(retrieval_task, root)
    metadata = TaskMetadata(
        name=name,
        dataset={"path": str(files[0].parent), "revision": "local"},
        description=(
            f"{retrieval_task} paraphrase retrieval built from the local SentEval files by st_hardneg.retrieval_data "
            "(queries: sentence 1 of the test paraphrase pairs; relevant: their sentence 2; corpus: every other "
            "distinct sentence of both splits); scored by mteb's retrieval evaluator (main score: nDCG@10)."
        ),
        reference="https://www.microsoft.com/en-us/download/details.aspx?id=52398",
        type="Retrieval",
        category="t2t",
        modalities=["text"],
        eval_splits=["test"],
        eval_langs=["eng-Latn"],
        main_score="ndcg_at_10",
        license="not specified",
        annotations_creators="human-annotated",
        dialect=[],
        sample_creation="found",
        bibtex_citation="",
    )
    attributes = {"metadata": metadata, "retrieval_task": retrieval_task, "root": root}
    cls = type(name.replace("-", "_").replace(".", "_"), (_local_retrieval_base(),), attributes)
    return cls()


def _local_task(name: str, data_dir: str | Path | None = None):
    if name in LOCAL_RETRIEVAL_TASKS:
        return local_retrieval_task(name, data_dir)
    return local_sts_task(name, data_dir)


def _encoder_class():
    require_mteb()
    from mteb.models import SentenceTransformerEncoderWrapper

    class _Encoder(SentenceTransformerEncoderWrapper):
        """mteb's SentenceTransformer wrapper; for local tasks, each distinct sentence of the task is encoded once
        (as :func:`evaluate_sts` does) and the embeddings are handed to mteb in float64, so that mteb's cosine is
        computed in the same precision as :func:`~st_hardneg.evaluation.cosine_spearman`."""

        def __init__(self, model, meta, local_tasks: dict[str, Any], batch_size: int, show_progress_bar: bool):
            super().__init__(model)
            self.mteb_model_meta = meta
            self._local_tasks = local_tasks
            self._tables: dict[str, dict[str, np.ndarray]] = {}
            self._batch_size = batch_size
            self._show_progress_bar = show_progress_bar

        def encode(self, inputs, *, task_metadata, hf_split, hf_subset, prompt_type=None, **kwargs):
            name = task_metadata.name
            if name not in self._local_tasks:
                return super().encode(inputs, task_metadata=task_metadata, hf_split=hf_split, hf_subset=hf_subset,
                                      prompt_type=prompt_type, **kwargs)
            if name not in self._tables:
                self._tables = {name: encode_unique(self.model, self._local_tasks[name].sentences(),
                                                    batch_size=self._batch_size,
                                                    show_progress_bar=self._show_progress_bar)}
            table = self._tables[name]
            texts = [text for batch in inputs for text in batch["text"]]
            dtype = getattr(self._local_tasks[name], "embedding_dtype", np.float64)
            return np.stack([table[t] for t in texts]).astype(dtype)

    return _Encoder


def _weights_digest(model) -> str:
    """SHA-256 (first 12 hex digits) of the module configs and weights: two checkpoints never share it."""
    import torch

    digest = hashlib.sha256()
    for module in model:
        config = module.get_config_dict() if hasattr(module, "get_config_dict") else {}
        digest.update(f"{type(module).__name__}:{json.dumps(config, sort_keys=True, default=str)}".encode())
    for name, tensor in model.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy())  # no copy
    return digest.hexdigest()[:12]


def _model_meta(model, model_name: str | None):
    from mteb.models import ModelMeta

    meta = ModelMeta.from_sentence_transformer_model(model)
    card = getattr(model, "model_card_data", None)
    base = getattr(card, "base_model", None)
    name = model_name or getattr(card, "model_name", None)
    if not name:
        name = "st-hardneg/" + (base or "model").rstrip("/").rsplit("/", 1)[-1]
    if "/" not in name:
        name = f"local/{name}"
    update = {"name": name, "revision": f"weights-{_weights_digest(model)}"}
    if base:
        update["adapted_from"] = base
    return meta.model_copy(update=update)


def _parse_tasks(tasks: Sequence[str] | str) -> list[str]:
    if isinstance(tasks, str):
        tasks = [t.strip() for t in tasks.split(",") if t.strip()]
    names: list[str] = []
    for task in tasks:
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
            + _local_equivalents_message(names)
        ) from None
    if _hub_offline():
        raise MTEBOfflineError(
            f"The official MTEB task(s) {', '.join(names)} download their data from the Hugging Face Hub, but the "
            "Hub is in offline mode (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE). " + _local_equivalents_message(names)
        )
    for task in tasks:
        try:
            task.load_data()
        except Exception as exc:
            raise MTEBOfflineError(
                f"Could not load the data of the official MTEB task {task.metadata.name} (it is downloaded from the "
                f"Hugging Face Hub; is there a network?): {type(exc).__name__}: {exc}. "
                + _local_equivalents_message(names)
            ) from exc
    return tasks


@contextmanager
def _preserved_rng():
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
    model,
    tasks: Sequence[str] | str,
    data_dir: str | Path | None = None,
    output_dir: str | Path | None = None,
    *,
    model_name: str | None = None,
    batch_size: int = 64,
    use_cache: bool = False,
    show_progress_bar: bool = True,
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
      an unnamed local model. Results are named after the model: ``model_name``, else the model card's
      ``model_name``, else ``st-hardneg/<base model>``; the revision is a digest of the weights
      (``weights-<sha256[:12]>``), so result files are traceable and a cache can never mix two checkpoints.
    - The training ``max_seq_length`` is lifted to the model's limit during the run; the global ``random`` /
      numpy / torch RNG states (which mteb reseeds when it builds tasks) are restored afterwards.

    Args:
        model: a SentenceTransformer.
        tasks: task names (list or comma-separated string), local and/or official.
        data_dir: the SentEval directory for local tasks (see :func:`st_hardneg.data.resolve_senteval_dir`).
        output_dir: if given, mteb writes its result files there (``results/<model>/<revision>/<task>.json`` and
            ``model_meta.json``); existing files are overwritten unless ``use_cache=True``.
        model_name: name recorded in the results (``org/name``; ``local/`` is prepended when there is no ``/``).
        batch_size: encoding batch size.
        use_cache: reuse results already in ``output_dir`` (or in mteb's default cache ``$MTEB_CACHE`` /
            ``~/.cache/mteb`` when ``output_dir`` is None) instead of recomputing them.
        show_progress_bar: show mteb's and the encoding progress bars.

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

    names = _parse_tasks(tasks)
    local_names = [n for n in names if n in LOCAL_MTEB_TASKS or n in LOCAL_RETRIEVAL_TASKS]
    official_names = [n for n in names if n not in local_names]
    was_training = getattr(model, "training", False)
    with _preserved_rng():
        official = _official_tasks(official_names) if official_names else []
        local = {name: _local_task(name, data_dir) for name in local_names}
        by_name = {**local, **{task.metadata.name: task for task in official}}
        ordered = [by_name[n] for n in names if n in by_name]
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*get_sentence_embedding_dimension", category=FutureWarning)
            meta = _model_meta(model, model_name)
            encoder = _encoder_class()(model, meta, local, batch_size, show_progress_bar)
        if output_dir is not None:
            cache_obj = ResultCache(Path(output_dir))
        else:
            cache_obj = ResultCache() if use_cache else None
        try:
            with full_length(model), warnings.catch_warnings():
                # mteb 2.x still calls ST's renamed get_sentence_embedding_dimension (a FutureWarning per task)
                warnings.filterwarnings("ignore", message=".*get_sentence_embedding_dimension", category=FutureWarning)
                result = mteb.evaluate(
                    encoder,
                    ordered,
                    cache=cache_obj,
                    overwrite_strategy="only-missing" if use_cache else "always",
                    encode_kwargs={"batch_size": batch_size, "show_progress_bar": show_progress_bar},
                    show_progress_bar=show_progress_bar,
                    co2_tracker=False,
                )
        finally:
            if was_training:
                model.train()
    if result.exceptions:
        raise RuntimeError(f"mteb failed on: {result.exceptions}")
    scores: dict[str, float] = {}
    metrics: dict[str, str] = {}
    for task_result in result.task_results:
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
