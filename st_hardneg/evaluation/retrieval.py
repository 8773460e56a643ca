"""Retrieval evaluation: sentence-transformers' ``InformationRetrievalEvaluator`` on the local retrieval tasks.

The tasks are built from the shared SentEval files by :mod:`st_hardneg.data.mrpc` (MRPC paraphrase retrieval;
see there for the exact definition). Each distinct text of a task is encoded once, at the model's full length
(:func:`~st_hardneg.evaluation.encode_unique`), for queries and documents alike: these are exactly the embeddings
that the task's mteb version (``MRPC-retrieval-local`` in :func:`~st_hardneg.evaluation.run_mteb`) scores, so the two
report the same nDCG@10 / MRR@10.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
from sentence_transformers.sentence_transformer.evaluation import InformationRetrievalEvaluator
from sentence_transformers.util import cos_sim

from st_hardneg.evaluation.encoding import encode_unique
from st_hardneg.validation import check_relevant_docs

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer
    from torch import Tensor

    from st_hardneg.data.mrpc import RetrievalTask

#: the metrics :func:`evaluate_retrieval` returns (x 100), in the evaluator's naming without the score function
RETRIEVAL_METRICS = ("ndcg@10", "mrr@10", "recall@1", "recall@10", "accuracy@1", "map@100")


class LocalRetrievalEvaluator(InformationRetrievalEvaluator):
    """``InformationRetrievalEvaluator`` with cosine scoring, each distinct text encoded once at full length.

    Use it like the sentence-transformers evaluator (also as the Trainer's ``evaluator``); the metric keys are
    ``"{name}_cosine_ndcg@10"``, ``"{name}_cosine_mrr@10"``, ``"{name}_cosine_recall@1"`` …, fractions in [0, 1].
    Queries and corpus are embedded in one pass over the task's distinct texts (queries first, then documents) with
    the training ``max_seq_length`` lifted to the model's limit.
    """

    def __init__(self, queries: dict[str, str], corpus: dict[str, str], relevant_docs: dict[str, set[str]],
                 name: str = "", batch_size: int = 64, show_progress_bar: bool = False,
                 max_seq_length: int | None = None, **kwargs: Any) -> None:
        if not queries or not corpus:
            raise ValueError(f"a retrieval task needs queries and a corpus, got {len(queries)} / {len(corpus)}")
        relevant_docs = check_relevant_docs(relevant_docs)
        unknown = sorted({d for docs in relevant_docs.values() for d in docs} - set(corpus))
        if unknown:
            raise ValueError(f"{len(unknown)} relevant document id(s) are not in the corpus, e.g. {unknown[0]!r}")
        if not any(relevant_docs.get(q) for q in queries):
            raise ValueError("no query has a relevant document")
        kwargs.setdefault("mrr_at_k", [10])
        kwargs.setdefault("ndcg_at_k", [10])
        kwargs.setdefault("accuracy_at_k", [1, 3, 5, 10])
        kwargs.setdefault("precision_recall_at_k", [1, 3, 5, 10, 100])
        kwargs.setdefault("map_at_k", [100])
        kwargs.setdefault("write_csv", False)
        super().__init__(cast(dict[str, Any], queries), cast(dict[str, Any], corpus), relevant_docs, name=name,
                         batch_size=batch_size, show_progress_bar=show_progress_bar,
                         score_functions={"cosine": cos_sim}, main_score_function="cosine", **kwargs)
        self._texts = cast(list[str], [*self.queries, *self.corpus])
        self._table: dict[str, np.ndarray] | None = None
        if max_seq_length is not None:
            from st_hardneg import validation

            validation.check_count(max_seq_length, "max_seq_length", minimum=1)
        self.max_seq_length = max_seq_length

    # the signature of InformationRetrievalEvaluator.__call__, which narrows BaseEvaluator's model: BaseModel
    def __call__(  # type: ignore[override]
        self, model: SentenceTransformer, output_path: str | None = None, epoch: int = -1, steps: int = -1,
        *args: Any, **kwargs: Any,
    ) -> dict[str, float]:
        self._table = self.encode(model, self._texts)
        return self.score_table(model, self._table, output_path, epoch, steps, *args, **kwargs)

    def encode(self, model: SentenceTransformer, texts: Sequence[str]) -> dict[str, np.ndarray]:
        """``{text: float32 embedding}`` of each distinct text, at :attr:`max_seq_length` (``None``: the model's
        full length)."""
        return encode_at_length(model, texts, self.max_seq_length, batch_size=self.batch_size,
                                show_progress_bar=self.show_progress_bar)

    def score_table(self, model: SentenceTransformer, table: dict[str, np.ndarray], output_path: str | None = None,
                    epoch: int = -1, steps: int = -1, *args: Any, **kwargs: Any) -> dict[str, float]:
        """The evaluator's metrics from embeddings already computed (``table`` must hold every query and document
        text), e.g. one corpus encoding shared by a dev and a test task."""
        absent = [t for t in self._texts if t not in table]
        if absent:
            raise ValueError(f"{len(absent)} text(s) of the task have no embedding in the table, e.g. {absent[0]!r}")
        self._table = table
        try:
            return super().__call__(model, output_path, epoch, steps, *args, **kwargs)
        finally:
            self._table = None

    # ST annotates the result np.ndarray, but its embed_inputs returns a Tensor (convert_to_tensor=True), as this does
    def embed_inputs(  # type: ignore[override]
        self, model: SentenceTransformer, sentences: Sequence[str], encode_fn_name: str | None = None,
        prompt_name: str | None = None, prompt: str | None = None, **kwargs: Any,
    ) -> Tensor:
        if self._table is None or prompt or prompt_name or self.truncate_dim is not None:
            return cast("Tensor", super().embed_inputs(model, sentences, encode_fn_name=encode_fn_name,
                                                       prompt_name=prompt_name, prompt=prompt, **kwargs))
        import torch

        return torch.from_numpy(np.stack([self._table[s] for s in sentences]))


@contextmanager
def at_length(model: SentenceTransformer, max_seq_length: int | None) -> Iterator[None]:
    """Encode at ``max_seq_length`` tokens for the duration of the block (``None``: leave it as it is), then
    restore the model's own value."""
    original = getattr(model, "max_seq_length", None)
    if max_seq_length is None or original is None:
        yield
        return
    model.max_seq_length = max_seq_length
    try:
        yield
    finally:
        model.max_seq_length = original


def encode_at_length(model: SentenceTransformer, texts: Sequence[str], max_seq_length: int | None, *,
                     batch_size: int = 64, show_progress_bar: bool = False) -> dict[str, np.ndarray]:
    """``{text: float32 embedding}`` of each distinct text at ``max_seq_length`` tokens (``None``: the model's full
    length, see :func:`~st_hardneg.evaluation.encoding.full_length`)."""
    with at_length(model, max_seq_length):
        return encode_unique(model, texts, batch_size=batch_size, show_progress_bar=show_progress_bar,
                             whole=max_seq_length is None)


def retrieval_evaluator(task: RetrievalTask, batch_size: int = 64, show_progress_bar: bool = False,
                        **kwargs: Any) -> LocalRetrievalEvaluator:
    """A :class:`LocalRetrievalEvaluator` for a :class:`~st_hardneg.data.mrpc.RetrievalTask` (named after it)."""
    return LocalRetrievalEvaluator(task.queries, task.corpus, task.relevant_docs, name=task.name,
                                   batch_size=batch_size, show_progress_bar=show_progress_bar, **kwargs)


def mrpc_retrieval_evaluator(data_dir: str | Path | None = None, batch_size: int = 64, show_progress_bar: bool = False,
                             **kwargs: Any) -> LocalRetrievalEvaluator:
    """The sentence-transformers ``InformationRetrievalEvaluator`` of the MRPC paraphrase-retrieval test task.

    Args:
        data_dir: the SentEval directory (see :func:`st_hardneg.data.senteval.resolve_senteval_dir`).
        batch_size: encoding batch size.
        show_progress_bar: show the encoding progress bar.
        **kwargs: passed to ``InformationRetrievalEvaluator`` (e.g. ``mrr_at_k``).

    Example:
        ::

            from st_hardneg.evaluation import mrpc_retrieval_evaluator

            evaluator = mrpc_retrieval_evaluator("path/to/senteval")
            scores = evaluator(model)   # {"MRPC-paraphrase-retrieval_cosine_ndcg@10": ..., ...}
    """
    from st_hardneg.data.mrpc import build_mrpc_retrieval

    return retrieval_evaluator(build_mrpc_retrieval(data_dir).task, batch_size=batch_size,
                               show_progress_bar=show_progress_bar, **kwargs)


def evaluate_retrieval(model: SentenceTransformer, data_dir: str | Path | None = None,
                       task: RetrievalTask | None = None, batch_size: int = 64,
                       show_progress_bar: bool = False) -> dict[str, float]:
    """Retrieval metrics x 100 of ``model`` on a local retrieval task (default: MRPC paraphrase retrieval).

    Args:
        model: a SentenceTransformer.
        data_dir: the SentEval directory (used when ``task`` is None).
        task: a :class:`~st_hardneg.data.mrpc.RetrievalTask`; None builds the MRPC task from ``data_dir``.
        batch_size: encoding batch size.
        show_progress_bar: show the encoding progress bar.

    Returns:
        ``{"ndcg@10", "mrr@10", "recall@1", "recall@10", "accuracy@1", "map@100"}`` → value x 100 (cosine scoring),
        plus ``"queries"`` and ``"corpus"`` (the task's sizes).
    """
    if task is None:
        from st_hardneg.data.mrpc import build_mrpc_retrieval

        task = build_mrpc_retrieval(data_dir).task
    evaluator = retrieval_evaluator(task, batch_size=batch_size, show_progress_bar=show_progress_bar)
    scores = evaluator(model)
    prefix = f"{task.name}_cosine_" if task.name else "cosine_"
    result = {metric: 100.0 * float(scores[prefix + metric]) for metric in RETRIEVAL_METRICS}
    result["queries"] = len(evaluator.queries)
    result["corpus"] = len(evaluator.corpus)
    return result


#: the metrics :func:`evaluate_beir` returns (x 100): BEIR's and MTEB's main score nDCG@10 first
BEIR_METRICS = ("ndcg@10", "mrr@10", "recall@10", "recall@100", "map@100")
#: the length MTEB evaluates all-MiniLM-L6-v2 at (its ``max_seq_length``); the BEIR protocol's encoding length
BEIR_MAX_SEQ_LENGTH = 256


def cached_embeddings(model: SentenceTransformer, texts: Sequence[str], *, max_seq_length: int | None,
                      batch_size: int = 64, show_progress_bar: bool = False,
                      cache_dir: str | Path | None = None) -> dict[str, np.ndarray]:
    """``{text: float32 embedding}`` of each distinct text, read from ``cache_dir`` when this model (a digest of its
    weights and module configs), length and text list were encoded before; written there (atomically) otherwise.

    Encoding a BEIR corpus takes minutes on a CPU: the untrained model's embeddings serve its evaluation, the GIST
    guide and reruns. ``cache_dir=None`` encodes without a cache.
    """
    import hashlib
    import json

    unique = list(dict.fromkeys(texts))

    def encode() -> dict[str, np.ndarray]:
        return encode_at_length(model, unique, max_seq_length, batch_size=batch_size,
                                show_progress_bar=show_progress_bar)

    if cache_dir is None:
        return encode()
    from st_hardneg.models import weights_digest

    text_digest = hashlib.sha256("\n".join(unique).encode()).hexdigest()[:12]
    stem = f"emb-{weights_digest(model)}-{max_seq_length or 'full'}-{text_digest}"
    path = Path(cache_dir).expanduser() / f"{stem}.npy"
    if path.is_file():
        try:
            matrix = np.load(path, allow_pickle=False)
            if matrix.shape[0] == len(unique):
                return dict(zip(unique, matrix, strict=True))
            raise ValueError(f"{matrix.shape[0]} rows for {len(unique)} texts")
        except (ValueError, OSError) as error:
            import logging

            logging.getLogger(__name__).warning("unreadable embedding cache %s (%s): encoding again", path, error)
    table = encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{stem}.tmp.npy")
    np.save(tmp, np.stack([table[t] for t in unique]))
    tmp.replace(path)
    path.with_suffix(".json").write_text(json.dumps({"texts": len(unique), "max_seq_length": max_seq_length}))
    return table


def evaluate_beir(model: SentenceTransformer, tasks: Sequence[RetrievalTask], *,
                  max_seq_length: int | None = BEIR_MAX_SEQ_LENGTH, batch_size: int = 64,
                  show_progress_bar: bool = False, cache_dir: str | Path | None = None) -> dict[str, dict[str, float]]:
    """Retrieval metrics x 100 of ``model`` on BEIR tasks (e.g. a split's dev and test tasks), with each distinct
    text encoded once for all of them: the tasks share the corpus, the slow part.

    Scored by sentence-transformers' ``InformationRetrievalEvaluator`` (cosine) on the texts mteb encodes
    (``"title text"``), at ``max_seq_length`` tokens (default 256, MTEB's length for all-MiniLM-L6-v2), so the test
    score compares to the model's published MTEB score.

    Args:
        model: a SentenceTransformer.
        tasks: :class:`~st_hardneg.data.mrpc.RetrievalTask` s, e.g. ``BEIRData.task("test")`` or a
            :class:`~st_hardneg.data.beir.BEIRRetrieval` 's ``task`` and ``dev_task``.
        max_seq_length: the encoding length; ``None`` = the model's full length.
        batch_size: encoding batch size.
        show_progress_bar: show the encoding progress bar.
        cache_dir: where embeddings are cached per model (see :func:`cached_embeddings`); ``None`` = no cache.

    Returns:
        ``{task name: {metric: value x 100 for metric in BEIR_METRICS} | {"queries", "corpus"}}``.

    Example:
        ::

            from st_hardneg.data.beir import beir_retrieval
            from st_hardneg.evaluation.retrieval import evaluate_beir

            split = beir_retrieval("path/to/scifact")
            scores = evaluate_beir(model, [split.dev_task, split.task])
            scores["scifact-test"]["ndcg@10"]
    """
    if not tasks:
        raise ValueError("evaluate_beir needs at least one task")
    names = [task.name for task in tasks]
    if len(set(names)) != len(names):
        raise ValueError(f"task names must be distinct (they prefix the metrics), got {names}")
    evaluators = [retrieval_evaluator(task, batch_size=batch_size, show_progress_bar=show_progress_bar,
                                      max_seq_length=max_seq_length) for task in tasks]
    texts = [text for evaluator in evaluators for text in evaluator._texts]
    table = cached_embeddings(model, texts, max_seq_length=max_seq_length, batch_size=batch_size,
                              show_progress_bar=show_progress_bar, cache_dir=cache_dir)
    out: dict[str, dict[str, float]] = {}
    for task, evaluator in zip(tasks, evaluators, strict=True):
        scores = evaluator.score_table(model, table)
        prefix = f"{task.name}_cosine_" if task.name else "cosine_"
        result = {metric: 100.0 * float(scores[prefix + metric]) for metric in BEIR_METRICS}
        result["queries"] = len(evaluator.queries)
        result["corpus"] = len(evaluator.corpus)
        out[task.name] = result
    return out


def per_query_ndcg(model: SentenceTransformer, task: RetrievalTask, k: int = 10, *,
                   max_seq_length: int | None = BEIR_MAX_SEQ_LENGTH, batch_size: int = 64,
                   show_progress_bar: bool = False, cache_dir: str | Path | None = None) -> dict[str, float]:
    """nDCG@k x 100 of each query of ``task`` (cosine ranking of the whole corpus, binary relevance as in
    sentence-transformers' evaluator; their mean is :func:`evaluate_beir`'s ``ndcg@10`` for ``k=10``): what a
    per-query gain histogram compares before and after training.

    Returns:
        ``{query id: nDCG@k x 100}`` in the task's query order.
    """
    import math

    import torch

    from st_hardneg import validation

    validation.check_count(k, "k", minimum=1)
    texts = [*task.queries.values(), *task.corpus.values()]
    table = cached_embeddings(model, texts, max_seq_length=max_seq_length, batch_size=batch_size,
                              show_progress_bar=show_progress_bar, cache_dir=cache_dir)
    doc_ids = list(task.corpus)
    docs = torch.from_numpy(np.stack([table[task.corpus[d]] for d in doc_ids]))
    queries = torch.from_numpy(np.stack([table[task.queries[q]] for q in task.queries]))
    scores = cos_sim(queries, docs)
    top = torch.topk(scores, min(k, len(doc_ids)), dim=1).indices.tolist()
    out: dict[str, float] = {}
    for qid, ranked in zip(task.queries, top, strict=True):
        relevant = task.relevant_docs.get(qid, set())
        if not relevant:
            continue
        dcg = sum(1.0 / math.log2(rank + 2) for rank, index in enumerate(ranked) if doc_ids[index] in relevant)
        ideal = sum(1.0 / math.log2(rank + 2) for rank in range(min(len(relevant), k)))
        out[qid] = 100.0 * dcg / ideal
    return out
