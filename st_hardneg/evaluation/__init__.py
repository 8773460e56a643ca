"""Evaluation: SentEval STS (the papers' protocol), local retrieval tasks, MTEB and shared encoding helpers."""

from st_hardneg.evaluation.diagnostics import (
    alignment,
    alignment_uniformity,
    format_alignment_table,
    uniformity,
)
from st_hardneg.evaluation.encoding import (
    COLLAPSE_TOLERANCE,
    DegenerateEmbeddingsError,
    check_embeddings,
    encode_unique,
    full_length,
    relative_spread,
)
from st_hardneg.evaluation.mteb_run import format_mteb_table, run_mteb
from st_hardneg.evaluation.mteb_tasks import (
    LOCAL_MTEB_TASKS,
    LOCAL_RETRIEVAL_TASKS,
    MTEBOfflineError,
    local_retrieval_task,
    local_sts_task,
)
from st_hardneg.evaluation.retrieval import (
    RETRIEVAL_METRICS,
    LocalRetrievalEvaluator,
    evaluate_retrieval,
    mrpc_retrieval_evaluator,
    retrieval_evaluator,
)
from st_hardneg.evaluation.sts import (
    INVALID_SCORE,
    SentEvalSTSEvaluator,
    cosine_spearman,
    evaluate_sts,
    format_sts_table,
)
from st_hardneg.evaluation.transfer import TRANSFER_TASKS, evaluate_transfer, format_transfer_table

__all__ = [
    "COLLAPSE_TOLERANCE",
    "INVALID_SCORE",
    "DegenerateEmbeddingsError",
    "check_embeddings",
    "LOCAL_MTEB_TASKS",
    "LOCAL_RETRIEVAL_TASKS",
    "RETRIEVAL_METRICS",
    "LocalRetrievalEvaluator",
    "TRANSFER_TASKS",
    "MTEBOfflineError",
    "alignment",
    "alignment_uniformity",
    "evaluate_retrieval",
    "evaluate_transfer",
    "format_alignment_table",
    "format_mteb_table",
    "format_transfer_table",
    "local_retrieval_task",
    "local_sts_task",
    "mrpc_retrieval_evaluator",
    "retrieval_evaluator",
    "run_mteb",
    "uniformity",
    "SentEvalSTSEvaluator",
    "cosine_spearman",
    "encode_unique",
    "evaluate_sts",
    "format_sts_table",
    "full_length",
    "relative_spread",
]
