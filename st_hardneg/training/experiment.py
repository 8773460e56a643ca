"""One experiment: train a model with a loss, select on STS-B dev, score the SentEval STS test sets.

The command line (``st-hardneg train``) and every benchmark script run their experiments through
:func:`run_experiment` (unsupervised sentences, STS) or the step under it, :func:`run_training` (any dataset, any
scoring, e.g. the retrieval benchmark), so a train-then-evaluate run is defined once (the benchmarks' grid of rows and
seeds is a study, :mod:`st_hardneg.training.studies`, each trial one such run).

>>> from st_hardneg.training.experiment import run_experiment
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from st_hardneg.training.loop import TrainConfig, TrainResult

if TYPE_CHECKING:
    from datasets import Dataset
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.evaluation.evaluator import BaseEvaluator
    from torch import nn

logger = logging.getLogger(__name__)


@dataclass
class ExperimentResult:
    """What :func:`run_experiment` produced: the trained model (modified in place), its loss and the scores."""

    model: Any
    loss: Any
    train: TrainResult
    sts: dict[str, float] | None
    #: what :func:`run_training`'s ``score`` returned (``None`` without one)
    scores: Any = None

    @property
    def loss_config(self) -> dict[str, Any]:
        """The loss's ``get_config_dict()`` as plain JSON values (non-JSON values become strings)."""
        config = self.loss.get_config_dict() if hasattr(self.loss, "get_config_dict") else {}
        return json.loads(json.dumps(config, default=str))

    def dev_curve(self) -> list[list[float]]:
        """``[[step, STS-B dev spearman], ...]`` from the Trainer's log history."""
        return dev_curve(self.train.log_history)

    def record(self, method: str, seed: int, *, loss: str | None = None, **fields: Any) -> dict[str, Any]:
        """The benchmarks' per-run record (one JSON row): ``method``, ``loss`` (when given), ``loss_config``, ``seed``,
        then the benchmark's own ``fields`` (scores, options), then the timing and the machine: ``train_seconds``
        (rounded to 0.1 s), ``median_step_seconds``, ``steps``, ``torch_threads`` and ``finished`` (local time)."""
        import torch

        head: dict[str, Any] = {"method": method, **({"loss": loss} if loss is not None else {})}
        return {**head, "loss_config": self.loss_config, "seed": seed, **fields,
                "train_seconds": round(self.train.train_seconds, 1),
                "median_step_seconds": self.train.median_step_seconds, "steps": self.train.steps,
                "torch_threads": torch.get_num_threads(), "finished": time.strftime("%Y-%m-%d %H:%M:%S")}


def dev_curve(log_history: list[dict[str, Any]]) -> list[list[float]]:
    """``[[step, STS-B dev spearman], ...]`` from the Trainer's log history."""
    return [[row["step"], row["eval_sts-dev_spearman"]] for row in log_history if "eval_sts-dev_spearman" in row]


def planned_steps(num_examples: int, config: TrainConfig) -> int:
    """Optimizer steps the Trainer will run on ``num_examples`` pairs under ``config`` (one device, no gradient
    accumulation).

    Raises:
        ValueError: the corpus is smaller than one batch while the last partial batch is dropped, or the run has
            zero steps (``epochs`` too small); the message says what to change.
    """
    if num_examples < 1:
        raise ValueError("no training sentences: the corpus is empty")
    batches = num_examples // config.batch_size if config.drop_last else math.ceil(num_examples / config.batch_size)
    if batches == 0:
        raise ValueError(
            f"the corpus has {num_examples} sentence(s), fewer than one batch of {config.batch_size}, and the last "
            "partial batch is dropped: use a larger corpus or a smaller --batch-size"
        )
    if config.max_steps and config.max_steps > 0:
        return config.max_steps
    steps = int(batches * config.epochs) if config.epochs else 0
    if steps < 1:
        raise ValueError(f"{config.epochs} epoch(s) of {batches} batch(es) is zero training steps: raise --epochs "
                         "or set --max-steps")
    return steps


def run_experiment(
    model: SentenceTransformer,
    loss_name: str,
    loss_kwargs: dict[str, Any] | None,
    sentences: Sequence[str],
    config: TrainConfig,
    data_dir: str | Path | None = None,
    *,
    evaluate_test: bool = True,
    sts_tasks: Sequence[str] | None = None,
    eval_batch_size: int = 128,
    callbacks: list | None = None,
    keep_checkpoints: bool = True,
) -> ExperimentResult:
    """Train ``model`` with the loss ``loss_name`` on ``sentences`` (unsupervised pairs), selecting the best
    checkpoint on STS-B dev every ``config.eval_steps`` steps and at the end, then score the STS test sets.

    Args:
        model: a SentenceTransformer (e.g. from :func:`st_hardneg.models.resolve_model`); trained in place.
        loss_name: a name in :data:`st_hardneg.training.registry.LOSSES`.
        loss_kwargs: the loss's hyperparameters (``None``: its paper defaults).
        sentences: training sentences.
        config: the training protocol (``config.output_dir`` holds the checkpoints).
        data_dir: the SentEval directory (see :func:`st_hardneg.data.senteval.resolve_senteval_dir`).
        evaluate_test: score the STS test sets after training (``False``: ``sts`` is ``None``, for screening).
        sts_tasks: the test tasks (default: the seven SentEval STS tasks).
        eval_batch_size: encoding batch size of the evaluations.
        callbacks: extra Trainer callbacks.
        keep_checkpoints: ``False`` removes the checkpoints this run wrote after it (see :func:`run_training`).

    Raises:
        ValueError: a corpus smaller than one batch or a run of zero steps (checked before the model is touched),
            an unknown loss or hyperparameter.
        DegenerateEmbeddingsError: the trained model's embeddings are NaN, zero or constant (from the test scoring).
    """
    from st_hardneg.data.senteval import pair_dataset
    from st_hardneg.evaluation import SentEvalSTSEvaluator, evaluate_sts
    from st_hardneg.training.registry import build_loss

    planned_steps(len(sentences), config)
    dev = SentEvalSTSEvaluator(data_dir, batch_size=eval_batch_size)  # reads the data: missing files fail here
    loss = build_loss(loss_name, model, **(loss_kwargs or {}))

    def score(trained: SentenceTransformer) -> dict[str, float]:
        return evaluate_sts(trained, data_dir, tasks=sts_tasks, batch_size=eval_batch_size,
                            show_progress_bar=config.show_progress_bar)

    run = run_training(model, loss, pair_dataset(list(sentences)), config, evaluator=dev,
                       score=score if evaluate_test else None, callbacks=callbacks, keep_checkpoints=keep_checkpoints)
    run.sts = run.scores
    return run


def run_training(
    model: SentenceTransformer,
    loss: nn.Module,
    dataset: Dataset,
    config: TrainConfig,
    *,
    evaluator: BaseEvaluator | None = None,
    score: Callable[[Any], Any] | None = None,
    callbacks: list | None = None,
    keep_checkpoints: bool = True,
) -> ExperimentResult:
    """Train ``model`` with a built ``loss`` on ``dataset`` (a ``datasets.Dataset`` in the loss's column layout),
    then ``score(model)``.

    Args:
        model: a SentenceTransformer; trained in place.
        loss: the loss module (of ``model``).
        dataset: the training data.
        config: the training protocol (``config.output_dir`` holds the checkpoints).
        evaluator: a sentence-transformers evaluator for model selection every ``config.eval_steps`` steps
            (``None``: the final model is kept).
        score: called on the trained model; its result is the experiment's ``scores``.
        callbacks: extra Trainer callbacks.
        keep_checkpoints: ``False`` removes the checkpoints this run wrote after it (only those: a file or folder
            the run did not write stays; :mod:`st_hardneg.training.checkpoints`).

    Raises:
        RuntimeError: the Trainer ran no step (the model would be scored untrained).
    """
    from st_hardneg.training.loop import train

    folder = Path(config.output_dir)
    existed = folder.exists()
    result = train(model, dataset, loss, config, evaluator=evaluator, callbacks=callbacks)
    if result.steps < 1:
        raise RuntimeError(f"training ran 0 steps on {len(dataset)} examples; the model is untrained")
    scores = score(model) if score is not None else None
    if not keep_checkpoints:  # only the checkpoints this run wrote, never anything else in the folder
        from st_hardneg.training.checkpoints import remove_written

        remove_written(folder, result.checkpoints)
        result.checkpoints = []
        if not existed and folder.is_dir() and not folder.is_symlink() and not any(folder.iterdir()):
            folder.rmdir()  # the Trainer made it and nothing is left in it
    return ExperimentResult(model=model, loss=loss, train=result, sts=None, scores=scores)
