"""The local MTEB tasks on the real ``mteb`` package: the SentEval STS sets as mteb STS tasks and a local retrieval
task (MRPC paraphrase retrieval, :mod:`st_hardneg.data.mrpc`), built from local files so they run offline.

The local tasks (``STS12-local`` … ``SICK-R-local``) are subclasses of mteb's ``AbsTaskSTS`` whose ``load_data``
reads the SentEval files with :func:`st_hardneg.data.senteval.read_sts_pairs`, so mteb's own STS evaluator scores them with
no network. Running them (and official MTEB tasks) is :func:`st_hardneg.evaluation.mteb_run.run_mteb`.

``mteb`` is imported lazily (it takes seconds to import), so ``import st_hardneg.evaluation`` stays fast.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from st_hardneg.data.beir import BEIRData
from st_hardneg.data.senteval import STS_YEAR_SUBSETS, check_sts_data, read_sts_pairs, resolve_senteval_dir, sts_files

if TYPE_CHECKING:
    from mteb.abstasks.abstask import AbsTask
    from mteb.abstasks.retrieval import AbsTaskRetrieval
    from mteb.abstasks.sts import AbsTaskSTS
    from mteb.abstasks.task_metadata import TaskMetadata
    from mteb.types import RelevantDocumentsType

    from st_hardneg.data.mrpc import RetrievalTask

logger = logging.getLogger(__name__)

#: local mteb task name -> SentEval STS task of :func:`st_hardneg.data.senteval.read_sts_pairs`
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
#: local mteb retrieval task name -> task of :mod:`st_hardneg.data.mrpc` (built from the SentEval MRPC files)
LOCAL_RETRIEVAL_TASKS: dict[str, str] = {
    "MRPC-retrieval-local": "MRPC",
}
_SCORE_RANGE = {"SICKRelatedness": (1, 5)}  # gold scale (only mteb's linear normalisation uses it)


class MTEBOfflineError(RuntimeError):
    """An official MTEB task could not get its data (no network / Hub offline); the message names the local tasks."""


def local_equivalents_message(names: Sequence[str]) -> str:
    pairs = [f"{name} -> {OFFICIAL_TO_LOCAL[name]}" for name in names if name in OFFICIAL_TO_LOCAL]
    text = "Local equivalents that run offline on the SentEval files: "
    text += "; ".join(pairs) + ". " if pairs else ""
    text += f"All local tasks: {', '.join([*LOCAL_MTEB_TASKS, *LOCAL_RETRIEVAL_TASKS])} (or tasks='local' for the "
    text += "seven STS test sets)."
    return text


def require_mteb() -> ModuleType:
    """The ``mteb`` module, or an ImportError saying how to install it (it is the optional ``[mteb]`` extra)."""
    try:
        import mteb
    except ImportError as exc:
        raise ImportError(
            "MTEB evaluation needs the optional 'mteb' package: pip install 'st-hardneg[mteb]'"
        ) from exc
    return mteb


def content_revision(files: Sequence[str | Path]) -> str:
    """The dataset revision of a local task: ``local-<SHA-256 of its files' bytes, 12 hex digits>``. mteb files a
    result under the task's name and records this revision beside it, so a cached result computed on other data
    (another folder with the same task name, or changed files) is told apart (see
    :func:`~st_hardneg.evaluation.mteb_run.run_mteb`)."""
    from st_hardneg.data.mining import file_digest

    return f"local-{file_digest(files)}"


def _metadata(name: str, data_file: Path, description: str, split: str = "test", *, revision: str = "local",
              **fields: Any) -> TaskMetadata:
    """mteb ``TaskMetadata`` of a local English text-to-text task on its test split (the file's folder as dataset
    path; ``revision``: :func:`content_revision` of its files); ``fields`` adds the task-specific ones
    (``reference``, ``type``, ``main_score`` …)."""
    from mteb.abstasks.task_metadata import TaskMetadata

    return TaskMetadata(
        name=name, dataset={"path": str(data_file.parent), "revision": revision}, description=description,
        category="t2t", modalities=["text"], eval_splits=[split], eval_langs=["eng-Latn"], license="not specified",
        annotations_creators="human-annotated", dialect=[], sample_creation="found", bibtex_citation="", **fields,
    )


@cache
def _local_task_base() -> type[AbsTaskSTS]:
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


def local_sts_task(name: str, data_dir: str | Path | None = None) -> AbsTaskSTS:
    """A local SentEval STS set as an mteb task (a subclass of ``mteb.abstasks.sts.AbsTaskSTS``).

    Args:
        name: one of :data:`LOCAL_MTEB_TASKS` (``STS12-local`` … ``STSBenchmark-local``, ``SICK-R-local``,
            ``STSBenchmark-dev-local``).
        data_dir: the SentEval directory (see :func:`st_hardneg.data.senteval.resolve_senteval_dir`).

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
    if name not in LOCAL_MTEB_TASKS:
        raise ValueError(f"unknown local MTEB task {name!r}; choose from {', '.join(LOCAL_MTEB_TASKS)}")
    sts_task = LOCAL_MTEB_TASKS[name]
    root = resolve_senteval_dir(data_dir)
    check_sts_data(root, [sts_task])
    subsets = STS_YEAR_SUBSETS.get(sts_task)
    official = [o for o, local in OFFICIAL_TO_LOCAL.items() if local == name]
    min_score, max_score = _SCORE_RANGE.get(sts_task, (0, 5))
    metadata = _metadata(
        name, root / sts_files(sts_task)[0],
        f"{sts_task} read from the local SentEval directory exactly as SentEval / SimCSE read it"
        + (f" (all scored pairs of {', '.join(subsets)} pooled)" if subsets else "")
        + "; scored by mteb's STS evaluator (main score: cosine Spearman).",
        reference="https://github.com/facebookresearch/SentEval", type="STS", main_score="cosine_spearman",
        adapted_from=official or None, revision=content_revision([root / f for f in sts_files(sts_task)]),
    )
    attributes = {"metadata": metadata, "sts_task": sts_task, "root": root, "min_score": min_score,
                  "max_score": max_score}
    cls = type(name.replace("-", "_").replace(".", "_"), (_local_task_base(),), attributes)
    return cls()


@cache
def _local_retrieval_base() -> type[AbsTaskRetrieval]:
    from datasets import Dataset
    from mteb.abstasks.retrieval import AbsTaskRetrieval

    class LocalRetrievalTask(AbsTaskRetrieval):
        """A local retrieval task of :mod:`st_hardneg.data.mrpc` as an mteb retrieval task (test split).

        Concrete tasks are subclasses made by :func:`local_retrieval_task`, with ``metadata``, ``retrieval_task``
        and ``root`` as class attributes. The embeddings are handed to mteb in float32, the precision in which
        sentence-transformers' ``InformationRetrievalEvaluator`` scores them, so both rank the corpus identically.
        """

        retrieval_task: str
        root: Path
        embedding_dtype = np.float32
        k_values = (1, 3, 5, 10, 20, 100, 1000)

        def _task(self) -> RetrievalTask:
            from st_hardneg.data.mrpc import build_retrieval_task

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

        def task_specific_scores(self, scores: dict[str, dict[str, float]], qrels: RelevantDocumentsType,
                                 results: dict[str, dict[str, float]], hf_split: str, hf_subset: str
                                 ) -> dict[str, float]:
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


def local_retrieval_task(name: str, data_dir: str | Path | None = None) -> AbsTaskRetrieval:
    """A local retrieval task as an mteb task (a subclass of ``mteb.abstasks.retrieval.AbsTaskRetrieval``).

    ``MRPC-retrieval-local`` is MRPC paraphrase retrieval (:func:`st_hardneg.data.mrpc.build_mrpc_retrieval`):
    main score nDCG@10. Scored by mteb's retrieval evaluator, it equals
    :func:`~st_hardneg.evaluation.evaluate_retrieval` (sentence-transformers' ``InformationRetrievalEvaluator``)
    for nDCG@10 and MRR@10.

    Args:
        name: one of :data:`LOCAL_RETRIEVAL_TASKS`.
        data_dir: the SentEval directory (see :func:`st_hardneg.data.senteval.resolve_senteval_dir`).

    Raises:
        ValueError: an unknown name.
        DataNotFoundError: the task's files are missing.
    """
    from st_hardneg.data.mrpc import retrieval_task_files, senteval_root

    if name not in LOCAL_RETRIEVAL_TASKS:
        raise ValueError(f"unknown local retrieval task {name!r}; choose from {', '.join(LOCAL_RETRIEVAL_TASKS)}")
    retrieval_task = LOCAL_RETRIEVAL_TASKS[name]
    root = senteval_root(data_dir)
    files = retrieval_task_files(retrieval_task, root)
    metadata = _metadata(
        name, files[0],
        f"{retrieval_task} paraphrase retrieval built from the local SentEval files by st_hardneg.data.mrpc "
        "(queries: sentence 1 of the test paraphrase pairs; relevant: their sentence 2; corpus: every other "
        "distinct sentence of both splits); scored by mteb's retrieval evaluator (main score: nDCG@10).",
        reference="https://www.microsoft.com/en-us/download/details.aspx?id=52398", type="Retrieval",
        main_score="ndcg_at_10",
    )
    attributes = {"metadata": metadata, "retrieval_task": retrieval_task, "root": root}
    cls = type(name.replace("-", "_").replace(".", "_"), (_local_retrieval_base(),), attributes)
    return cls()


@cache
def _beir_base() -> type[AbsTaskRetrieval]:
    from datasets import Dataset

    class BEIRFolderTask(_local_retrieval_base()):  # type: ignore[misc,valid-type]
        """A BEIR folder's split as an mteb retrieval task: the corpus keeps its ``title`` and ``text`` columns, which
        mteb joins as it does for its own BEIR tasks. Concrete tasks are made by :func:`beir_mteb_task`."""

        beir: BEIRData
        split: str
        max_seq_length: int | None

        def _task(self) -> RetrievalTask:
            return self.beir.task(self.split, name=self.metadata.name)

        def load_data(self, num_proc: int | None = None, **kwargs: Any) -> None:
            if self.data_loaded:  # type: ignore[has-type]
                return
            data, relevant = self.beir, self.beir.relevant(self.split)
            queries = sorted(relevant)
            corpus = list(data.corpus)
            self.dataset = {"default": {self.split: {
                "queries": Dataset.from_dict({"id": queries, "text": [data.queries[q] for q in queries]}),
                "corpus": Dataset.from_dict({"id": corpus, "title": [data.titles[d] for d in corpus],
                                             "text": [data.texts[d] for d in corpus]}),
                "relevant_docs": {q: dict(sorted(data.qrels[self.split][q].items())) for q in queries},
                "top_ranked": None,
            }}}
            self.data_loaded = True

        def sentences(self) -> list[str]:
            task = self._task()
            return [*(task.queries[q] for q in sorted(task.queries)), *task.corpus.values()]

    return BEIRFolderTask


def beir_mteb_task(data: BEIRData | str | Path, split: str = "test", name: str | None = None,
                   max_seq_length: int | None = 256) -> AbsTaskRetrieval:
    """A split of a BEIR folder as an mteb retrieval task (a subclass of ``mteb.abstasks.retrieval.AbsTaskRetrieval``),
    scored by mteb's own retrieval evaluator with no network; pass it to
    :func:`~st_hardneg.evaluation.mteb_run.run_mteb` in ``tasks``.

    On SciFact's test split this is MTEB's ``SciFact`` task: same queries, corpus (title and text, joined by mteb),
    judgements and main score nDCG@10; encoded at ``max_seq_length`` tokens (256: the length MTEB evaluates
    all-MiniLM-L6-v2 at; ``None`` = the model's full length). Scores equal
    :func:`~st_hardneg.evaluation.retrieval.evaluate_beir`'s at the same length.

    Args:
        data: a :class:`~st_hardneg.data.beir.BEIRData` or a BEIR folder.
        split: the qrels split to evaluate.
        name: the task name (default ``"<data name>-<split>-local"``).
        max_seq_length: the encoding length.

    Raises:
        DataNotFoundError, BEIRFormatError: see :func:`~st_hardneg.data.beir.load_beir`.
        ValueError: the split is absent or has no relevant judgement.
    """
    from st_hardneg.data.beir import load_beir

    data = data if isinstance(data, BEIRData) else load_beir(data)
    data.relevant(split)  # raises on an absent or empty split
    name = name or f"{data.name}-{split}-local"
    metadata = _metadata(
        name, data.root / "corpus.jsonl",
        f"The {split} split of the BEIR folder {data.root} ({len(data.corpus)} documents), read by "
        "st_hardneg.data.beir; scored by mteb's retrieval evaluator (main score: nDCG@10).",
        split=split, reference="https://github.com/beir-cellar/beir", type="Retrieval", main_score="ndcg_at_10",
        revision=content_revision(data.files()),
    )
    attributes = {"metadata": metadata, "beir": data, "split": split, "max_seq_length": max_seq_length,
                  "root": data.root, "retrieval_task": name}
    cls = type(name.replace("-", "_").replace(".", "_"), (_beir_base(),), attributes)
    return cls()


def local_task(name: str, data_dir: str | Path | None = None) -> AbsTask:
    """The local STS or retrieval task ``name`` (see :data:`LOCAL_MTEB_TASKS`, :data:`LOCAL_RETRIEVAL_TASKS`)."""
    if name in LOCAL_RETRIEVAL_TASKS:
        return local_retrieval_task(name, data_dir)
    return local_sts_task(name, data_dir)
