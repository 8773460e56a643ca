"""Evaluation: SentEval STS (the papers' protocol) and shared encoding helpers."""

from st_hardneg.evaluation.encoding import encode_unique, full_length
from st_hardneg.evaluation.sts import SentEvalSTSEvaluator, cosine_spearman, evaluate_sts, format_sts_table

__all__ = [
    "SentEvalSTSEvaluator",
    "cosine_spearman",
    "encode_unique",
    "evaluate_sts",
    "format_sts_table",
    "full_length",
]
