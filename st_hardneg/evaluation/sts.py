"""SentEval STS evaluation with the papers' protocol (SimCSE's "all" setting, Spearman × 100)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
from scipy.stats import spearmanr
from sentence_transformers.base.evaluation.evaluator import BaseEvaluator

from st_hardneg.data.senteval import STS_DEV_TASKS, STS_TASKS, check_sts_data, read_sts_pairs, resolve_senteval_dir
from st_hardneg.evaluation.encoding import DegenerateEmbeddingsError, encode_unique, parse_task_list
from st_hardneg.reporting import markdown_table

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.model import BaseModel

logger = logging.getLogger(__name__)


#: the STS-B dev score a degenerate model gets during training: the lowest possible Spearman x 100, so it can never
#: be selected as the best checkpoint (a ``nan`` would: the Trainer never replaces a ``nan`` best metric)
INVALID_SCORE = -100.0


def cosine_spearman(embeddings1: np.ndarray, embeddings2: np.ndarray, gold: Sequence[float]) -> float:
    """Spearman correlation × 100 between the row-wise cosine of two embedding matrices and the gold scores.

    Raises:
        DegenerateEmbeddingsError: a non-finite or zero embedding, or all cosines equal (Spearman is undefined).
        ValueError: fewer than two pairs, mismatched lengths or widths, 1-D embeddings, a non-finite gold score, or
            constant gold scores.
    """
    a = np.asarray(embeddings1, dtype=np.float64)
    b = np.asarray(embeddings2, dtype=np.float64)
    y = np.asarray(gold, dtype=np.float64)
    for name, matrix in (("embeddings1", a), ("embeddings2", b)):
        if matrix.ndim != 2:
            raise ValueError(f"{name} must be a 2-D array (one embedding a row), got shape {matrix.shape}")
    if y.ndim != 1:
        raise ValueError(f"gold must be a 1-D sequence of scores, got shape {y.shape}")
    if not (len(a) == len(b) == len(y)) or len(y) < 2:
        raise ValueError(f"cosine_spearman needs >= 2 pairs of equal length, got {len(a)}, {len(b)}, {len(y)}")
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"embeddings1 and embeddings2 must have the same width, got {a.shape[1]} and {b.shape[1]}")
    bad = np.flatnonzero(~np.isfinite(y))
    if len(bad):
        raise ValueError(f"gold has {len(bad)} non-finite score(s) (NaN or infinite), first at index {bad[0]}: the "
                         "Spearman correlation would be NaN")
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise DegenerateEmbeddingsError("non-finite (NaN or infinite) embeddings: the Spearman score is undefined")
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    if (norms == 0).any():
        raise DegenerateEmbeddingsError(f"{int((norms == 0).sum())} pair(s) with an all-zero embedding: cosine is "
                                        "undefined")
    if np.all(y == y[0]):
        raise ValueError("all gold scores are equal: the Spearman correlation is undefined")
    cos = (a * b).sum(axis=1) / norms
    if np.all(cos == cos[0]):
        raise DegenerateEmbeddingsError(
            f"all {len(cos)} cosine similarities equal {cos[0]:.6g} (constant embeddings?): the Spearman correlation is "
            "undefined"
        )
    return float(spearmanr(cos, y).statistic * 100)


def _check_tasks(tasks: Sequence[str] | str | None) -> list[str]:
    return parse_task_list(tasks, STS_TASKS + STS_DEV_TASKS, "STS", default=STS_TASKS)


def evaluate_sts(
    model: SentenceTransformer,
    data_dir: str | Path | None = None,
    tasks: Sequence[str] | None = None,
    batch_size: int = 64,
    show_progress_bar: bool = True,
) -> dict[str, float]:
    """Spearman correlation × 100 of cosine similarity with the gold scores, the SentEval/SimCSE way.

    - STS12–STS16: SimCSE's "all" setting: every scored pair of all subsets of the year pooled into one Spearman.
    - STSBenchmark: ``sts-test.csv``; SICKRelatedness: ``SICK_test_annotated.txt``.
    - ``avg``: the mean over the evaluated tasks (the 7 above by default).
    - Each distinct sentence is encoded once, at the model's full length (a training ``max_seq_length`` is lifted
      during evaluation and restored afterwards).

    Args:
        model: a SentenceTransformer.
        data_dir: the SentEval directory (see :func:`st_hardneg.data.senteval.resolve_senteval_dir`).
        tasks: subset of ``STS12, STS13, STS14, STS15, STS16, STSBenchmark, SICKRelatedness`` (and
            ``STSBenchmark-dev``, for model selection only); ``None`` = the 7 test tasks.
        batch_size: encoding batch size.
        show_progress_bar: show the encoding progress bar.

    Returns:
        ``{task: score, ..., "avg": mean}``.

    Raises:
        DegenerateEmbeddingsError: the model's embeddings are non-finite, zero or collapsed: all within a relative
            spread of :data:`~st_hardneg.evaluation.encoding.COLLAPSE_TOLERANCE` (1e-4) of one point, identical rows
            included (no score is meaningful; see :func:`~st_hardneg.evaluation.encoding.check_embeddings`).
        DataFormatError: a damaged data file (see :func:`st_hardneg.data.senteval.read_sts_pairs`).
    """
    tasks = _check_tasks(tasks)
    root = resolve_senteval_dir(data_dir)
    check_sts_data(root, tasks)
    pairs = {task: read_sts_pairs(root, task) for task in tasks}
    every_sentence = (s for s1, s2, _ in pairs.values() for s in (*s1, *s2))
    table = encode_unique(model, every_sentence, batch_size=batch_size, show_progress_bar=show_progress_bar,
                          desc=f"STS ({', '.join(tasks)}): encoding")
    results = {}
    for task, (s1, s2, gold) in pairs.items():
        results[task] = cosine_spearman(np.stack([table[s] for s in s1]), np.stack([table[s] for s in s2]), gold)
    results["avg"] = float(np.mean([results[t] for t in tasks]))
    return results


def format_sts_table(rows: dict[str, dict[str, float]], tasks: Sequence[str] | None = None) -> str:
    """A markdown table, one row per model / method: ``{name: evaluate_sts(...) result}``."""
    if not rows:
        return ""
    if tasks is None:
        first = next(iter(rows.values()))
        tasks = [t for t in (*STS_TASKS, *STS_DEV_TASKS) if t in first]
    header = ["model", *tasks, "avg"]
    body = [[name, *(f"{scores[t]:.2f}" if t in scores else "–" for t in (*tasks, "avg"))]
            for name, scores in rows.items()]
    return markdown_table(header, body).rstrip("\n")


class SentEvalSTSEvaluator(BaseEvaluator):
    """
    A sentence-transformers evaluator for the SentEval STS sets, for model selection during training.

    Pass it to the Trainer as ``evaluator=`` with ``eval_strategy="steps"``: the papers evaluate STS-B dev every
    125 steps (250 in SimCSE) and keep the best checkpoint. Select on ``STSBenchmark-dev`` only, never on a test set.
    The data is read once, at construction; each call encodes each distinct sentence once at full length.

    Degenerate embeddings (NaN, zero, or collapsed: a relative spread below
    :data:`~st_hardneg.evaluation.encoding.COLLAPSE_TOLERANCE`, e.g. after a diverged step) do not raise here, since an
    exception would end the training run: the call logs a warning and returns :data:`INVALID_SCORE` (-100, the
    lowest Spearman x 100) for every metric plus ``{name}_invalid = 1``, so that step can never be selected as the
    best checkpoint. :func:`evaluate_sts` raises instead.

    Args:
        data_dir: the SentEval directory (see :func:`st_hardneg.data.senteval.resolve_senteval_dir`).
        tasks: the tasks to score; default ``("STSBenchmark-dev",)``.
        name: prefix of the metric names (``{name}_spearman`` is the primary metric: the mean over ``tasks``).
        batch_size: encoding batch size.
        show_progress_bar: show the encoding progress bar.

    Example:
        ::

            from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments
            from st_hardneg.evaluation import SentEvalSTSEvaluator

            dev = SentEvalSTSEvaluator("path/to/senteval")
            args = SentenceTransformerTrainingArguments(
                output_dir="out", eval_strategy="steps", eval_steps=125, save_strategy="steps", save_steps=125,
                load_best_model_at_end=True, metric_for_best_model="sts-dev_spearman",
            )
            trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=train, loss=loss, evaluator=dev)
    """

    def __init__(
        self,
        data_dir: str | Path | None = None,
        tasks: Sequence[str] = ("STSBenchmark-dev",),
        name: str = "sts-dev",
        batch_size: int = 64,
        show_progress_bar: bool = False,
    ) -> None:
        super().__init__()
        self.tasks = _check_tasks(tasks)
        self.root = resolve_senteval_dir(data_dir)
        check_sts_data(self.root, self.tasks)
        self.pairs = {task: read_sts_pairs(self.root, task) for task in self.tasks}
        self.name = name
        self.batch_size = batch_size
        self.show_progress_bar = show_progress_bar
        self.primary_metric = "spearman"
        self.greater_is_better = True

    def __call__(self, model: BaseModel, output_path: str | None = None, epoch: int = -1,
                 steps: int = -1) -> dict[str, float]:
        sentences = (s for s1, s2, _ in self.pairs.values() for s in (*s1, *s2))
        metrics: dict[str, float] = {}
        try:
            table = encode_unique(cast("SentenceTransformer", model), sentences, batch_size=self.batch_size,
                                  show_progress_bar=self.show_progress_bar, desc=f"{self.name}: encoding")
            for task, (s1, s2, gold) in self.pairs.items():
                score = cosine_spearman(np.stack([table[s] for s in s1]), np.stack([table[s] for s in s2]), gold)
                metrics[f"spearman_{task}"] = score
            metrics["spearman"] = float(np.mean(list(metrics.values())))
        except DegenerateEmbeddingsError as exc:
            # During training an exception would end the run and lose its earlier checkpoints: the step gets the
            # lowest possible score instead, so it can never be the selected checkpoint, and a loud warning.
            logger.warning("SentEval STS (%s) after %s steps is INVALID, scored %s: %s", ", ".join(self.tasks),
                           steps, INVALID_SCORE, exc)
            metrics = {f"spearman_{task}": INVALID_SCORE for task in self.tasks}
            metrics["spearman"] = INVALID_SCORE
            metrics["invalid"] = 1.0
        logger.info("SentEval STS (%s) after %s steps: %s", ", ".join(self.tasks), steps,
                    ", ".join(f"{k}={v:.2f}" for k, v in metrics.items()))
        metrics = self.prefix_name_to_metrics(metrics, self.name)
        self.store_metrics_in_model_card_data(model, metrics, epoch, steps)
        return metrics

    def get_config_dict(self) -> dict[str, Any]:
        return {"tasks": self.tasks}
