"""Retrieval evaluation: sentence-transformers' ``InformationRetrievalEvaluator`` on the local retrieval tasks.

The tasks are built from the shared SentEval files by :mod:`st_hardneg.data.mrpc` (MRPC paraphrase retrieval;
see there for the exact definition). Each distinct text of a task is encoded once, at the model's full length
(:func:`~st_hardneg.evaluation.encode_unique`), for queries and documents alike: these are exactly the embeddings
that the task's mteb version (``MRPC-retrieval-local`` in :func:`~st_hardneg.evaluation.run_mteb`) scores, so the two
report the same nDCG@10 / MRR@10.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
from sentence_transformers.sentence_transformer.evaluation import InformationRetrievalEvaluator
from sentence_transformers.util import cos_sim

from st_hardneg.evaluation.encoding import encode_unique

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
                 name: str = "", batch_size: int = 64, show_progress_bar: bool = False, **kwargs: Any) -> None:
        if not queries or not corpus:
            raise ValueError(f"a retrieval task needs queries and a corpus, got {len(queries)} / {len(corpus)}")
        unknown = sorted({d for docs in relevant_docs.values() for d in docs} - set(corpus))
        if unknown:
            raise ValueError(f"{len(unknown)} relevant document id(s) are not in the corpus, e.g. {unknown[0]!r}")
        if not any(relevant_docs.get(q) for q in queries):
            raise ValueError("no query has a relevant document")
        kwargs.setdefault("mrr_at_k", [10])
        kwargs.setdefault("ndcg_at_k", [10])
        kwargs.setdefault("accuracy_at_k", [1, 3, 5, 10])
        kwargs.setdefault("precision_recall_at_k", [1, 3, 5, 10])
        kwargs.setdefault("map_at_k", [100])
        kwargs.setdefault("write_csv", False)
        super().__init__(cast(dict[str, Any], queries), cast(dict[str, Any], corpus), relevant_docs, name=name,
                         batch_size=batch_size, show_progress_bar=show_progress_bar,
                         score_functions={"cosine": cos_sim}, main_score_function="cosine", **kwargs)
        self._texts = cast(list[str], [*self.queries, *self.corpus])
        self._table: dict[str, np.ndarray] | None = None

    # the signature of InformationRetrievalEvaluator.__call__, which narrows BaseEvaluator's model: BaseModel
    def __call__(  # type: ignore[override]
        self, model: SentenceTransformer, output_path: str | None = None, epoch: int = -1, steps: int = -1,
        *args: Any, **kwargs: Any,
    ) -> dict[str, float]:
        self._table = encode_unique(model, self._texts, batch_size=self.batch_size,
                                    show_progress_bar=self.show_progress_bar)
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
