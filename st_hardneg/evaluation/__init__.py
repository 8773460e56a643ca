"""Evaluation: SentEval STS (the papers' protocol), retrieval scored as mteb scores it (graded, ``pytrec_eval``),
MTEB, paired comparison of runs (:func:`compare_runs`) and shared encoding helpers."""

from st_hardneg.evaluation.compare import ComparisonResult, DatasetComparison, compare_runs
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
    RetrievalResult,
    evaluate_beir,
    evaluate_retrieval,
    mrpc_retrieval_evaluator,
    retrieval_evaluator,
    retrieve,
)
from st_hardneg.evaluation.runs import read_per_query, read_trec_run, score_run, write_per_query, write_trec_run
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
    "ComparisonResult",
    "DatasetComparison",
    "RetrievalResult",
    "compare_runs",
    "evaluate_beir",
    "read_per_query",
    "read_trec_run",
    "retrieve",
    "score_run",
    "write_per_query",
    "write_trec_run",
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
