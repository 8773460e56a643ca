"""One training recipe shared by the CLI, the benchmarks and the notebooks: the papers' unsupervised protocol on the
sentence-transformers Trainer, with STS-B dev model selection and honest step timing.

>>> from st_hardneg.training import TrainConfig, build_loss, train
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from transformers import TrainerCallback as TrainerCallbackBase

from st_hardneg.training.callbacks import CHECKPOINT_RUN_FILE, EvaluateAtEnd, StepTimer, StopAfterSteps

if TYPE_CHECKING:
    from datasets import Dataset
    from sentence_transformers import SentenceTransformer, SentenceTransformerTrainingArguments
    from sentence_transformers.base.evaluation.evaluator import BaseEvaluator
    from torch import nn
    from transformers import TrainerCallback

logger = logging.getLogger(__name__)

__all__ = ["TrainConfig", "TrainResult", "check_hub_access", "check_precision", "find_checkpoint", "train",
           "training_arguments"]


# --------------------------------------------------------------------------- the recipe
@dataclass
class TrainConfig:
    """Hyperparameters of the unsupervised protocol (defaults: the papers' BERT-base setting).

    ``max_steps`` (> 0) shortens the run *and* its LR schedule; ``stop_after_steps`` (> 0) keeps the full run's
    schedule and stops early (see :class:`StopAfterSteps`), for screening hyperparameters. ``warmup_ratio`` is the
    share of the steps, in [0, 1), with linear warm-up. Every value is checked when the config is made: a
    ``ValueError`` names all bad ones. ``extra_args`` are ``SentenceTransformerTrainingArguments`` fields that
    override the recipe's values (the command line's ``--training-arg``:
    :func:`st_hardneg.cli.training_args.parse_training_args`); with ``resume_from_checkpoint`` (a checkpoint
    folder) :func:`train` resumes from it.
    """

    output_dir: str = "output/st-hardneg"
    batch_size: int = 64
    learning_rate: float = 3e-5
    epochs: float = 1.0
    max_steps: int = -1
    stop_after_steps: int = 0
    warmup_ratio: float = 0.0
    seed: int = 0
    eval_steps: int = 125
    logging_steps: int = 10
    no_duplicates: bool = True
    drop_last: bool = True
    save_checkpoints: bool = True
    fp16: bool = False
    bf16: bool = False
    show_progress_bar: bool = True
    extra_args: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # checked here, where the config is made (before any data, model or mining): a bad value never reaches the
        # Trainer, which would fail late or, for warmup_ratio = 1.0, silently warm up for one step
        def whole(value: Any) -> bool:
            return isinstance(value, int) and not isinstance(value, bool)

        def real(value: Any) -> bool:
            return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)

        problems = []
        if not whole(self.batch_size) or self.batch_size < 1:
            problems.append(f"batch_size must be a positive integer, got {self.batch_size!r}")
        if not real(self.learning_rate) or self.learning_rate <= 0:
            problems.append(f"learning_rate must be a positive number, got {self.learning_rate!r}")
        if not real(self.epochs) or self.epochs <= 0:
            problems.append(f"epochs must be a positive number, got {self.epochs!r}")
        if not real(self.warmup_ratio) or not 0 <= self.warmup_ratio < 1:
            problems.append(f"warmup_ratio must be in [0, 1) (a share of the steps), got {self.warmup_ratio!r}")
        if not whole(self.max_steps) or (self.max_steps < 1 and self.max_steps != -1):
            problems.append(f"max_steps must be a positive integer or -1 (use epochs), got {self.max_steps!r}")
        for name in ("stop_after_steps", "eval_steps"):
            value = getattr(self, name)
            if not whole(value) or value < 0:
                problems.append(f"{name} must be a non-negative integer (0 = off), got {value!r}")
        if not whole(self.logging_steps) or self.logging_steps < 1:
            problems.append(f"logging_steps must be a positive integer, got {self.logging_steps!r}")
        if self.fp16 and self.bf16:
            problems.append("fp16 and bf16 are exclusive: choose one")
        if problems:
            raise ValueError("TrainConfig: " + "; ".join(problems))


@dataclass
class TrainResult:
    """What :func:`train` measured."""

    train_seconds: float
    steps: int
    median_step_seconds: float | None
    step_seconds: list[float]
    best_metric: float | None
    best_checkpoint: str | None
    log_history: list[dict[str, Any]]
    #: the checkpoint folders (names inside the output folder) this run wrote and kept; nothing else there is its
    checkpoints: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def training_arguments(config: TrainConfig, with_evaluator: bool) -> SentenceTransformerTrainingArguments:
    """``SentenceTransformerTrainingArguments`` for the protocol in ``config``."""
    from sentence_transformers import SentenceTransformerTrainingArguments
    from sentence_transformers.base.sampler import BatchSamplers

    evaluate = with_evaluator and config.eval_steps > 0
    save = evaluate and config.save_checkpoints
    kwargs: dict[str, Any] = dict(
        output_dir=config.output_dir,
        per_device_train_batch_size=config.batch_size,
        learning_rate=config.learning_rate,
        num_train_epochs=config.epochs,
        max_steps=config.max_steps,
        warmup_steps=float(config.warmup_ratio),  # a float in [0, 1) is a share of the steps (transformers >= 5)
        lr_scheduler_type="linear",
        seed=config.seed,
        data_seed=config.seed,
        batch_sampler=BatchSamplers.NO_DUPLICATES if config.no_duplicates else BatchSamplers.BATCH_SAMPLER,
        dataloader_drop_last=config.drop_last,
        logging_steps=config.logging_steps,
        eval_strategy="steps" if evaluate else "no",
        eval_steps=config.eval_steps if evaluate else None,
        save_strategy="steps" if save else "no",
        save_steps=config.eval_steps if save else None,
        save_total_limit=2 if save else None,
        load_best_model_at_end=save,
        metric_for_best_model="eval_sts-dev_spearman" if save else None,
        greater_is_better=True,
        report_to=[],
        fp16=config.fp16,
        bf16=config.bf16,
        disable_tqdm=not config.show_progress_bar,
        dataloader_pin_memory=_has_cuda(),  # pinning without a GPU only warns
    )
    kwargs.update(config.extra_args)
    return SentenceTransformerTrainingArguments(**kwargs)


def _has_cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def _rows(dataset: Any) -> str:
    try:
        return str(len(dataset))
    except TypeError:  # an iterable dataset
        return "its"


def _check_some_steps(train_dataset: Any, args: SentenceTransformerTrainingArguments) -> None:
    """Raise ``ValueError`` when ``train_dataset`` (a sized dataset) cannot fill one batch of ``args``: the run
    would make 0 optimizer steps and return an untrained model."""
    if isinstance(train_dataset, dict) or not hasattr(train_dataset, "__len__"):
        return  # several datasets or an iterable one: the Trainer's step count is checked after training
    rows = len(train_dataset)
    batch = args.per_device_train_batch_size * max(args.world_size, 1)
    if rows == 0:
        raise ValueError("train_dataset has no rows: the run would make 0 optimizer steps")
    if rows < batch and args.dataloader_drop_last:
        raise ValueError(
            f"train_dataset has {rows} row(s), fewer than one batch of {batch}, and the last partial batch is dropped "
            "(drop_last): the run would make 0 optimizer steps. Use more data or a smaller batch_size.")


class LogsToLogger(TrainerCallbackBase):
    """transformers' ``PrinterCallback`` (the log dicts ``{'loss': ...}`` printed to stdout when there is no progress
    bar) sent to this module's logger at INFO instead: stdout is left to a run's results (``st-hardneg train -q``),
    the logs show on stderr with ``-v``."""

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None,
               **kwargs: Any) -> None:
        if logs and state.is_local_process_zero:
            logger.info("step %d: %s", state.global_step, {k: v for k, v in logs.items() if k != "total_flos"})


def train(model: SentenceTransformer, train_dataset: Dataset, loss: nn.Module, config: TrainConfig,
          evaluator: BaseEvaluator | None = None, callbacks: list[TrainerCallback] | None = None) -> TrainResult:
    """Train ``model`` with ``loss`` on ``train_dataset`` (columns anchor, positive) using the ST Trainer.

    With an ``evaluator`` (e.g. :class:`~st_hardneg.evaluation.SentEvalSTSEvaluator` on STS-B dev) the model is
    evaluated every ``config.eval_steps`` steps and at the end, and the best checkpoint is loaded at the end
    (the papers' selection rule). The model is modified in place. Checkpoints are rotated among this run's own
    (``save_total_limit``), never a folder the run did not write
    (:class:`~st_hardneg.training.callbacks.CheckpointLedgerCallback`); ``TrainResult.checkpoints`` names those it
    kept. ``config.extra_args["resume_from_checkpoint"]``
    resumes from that checkpoint folder (a stateful loss too, exactly:
    :class:`~st_hardneg.training.callbacks.StatefulLossCallback`). The model card names st-hardneg
    (:class:`~st_hardneg.training.callbacks.ModelCardCallback`). Without a progress bar
    (``config.show_progress_bar=False``) the Trainer's log dicts go to this module's logger (:class:`LogsToLogger`),
    not to stdout.

    Raises:
        ValueError: ``train_dataset`` has fewer rows than one batch (with ``drop_last``) or no row: the run would
            make no optimizer step (checked before the Trainer is built).
        RuntimeError: the Trainer made no optimizer step all the same (e.g. ``BatchSamplers.NO_DUPLICATES`` could
            not fill one batch of distinct texts): the model is untrained, and no result is returned for it.

    Warns:
        UserWarning: ``loss`` was built on another model than ``model`` (see
            :func:`~st_hardneg.training.callbacks.check_loss_model`; before the Trainer is built), or the Trainer's
            optimizer holds none of ``model``'s parameters (at the start of training): ``model`` would not train.
    """
    from sentence_transformers import SentenceTransformerTrainer

    from st_hardneg.training.callbacks import (
        CheckpointLedgerCallback,
        LossModelCheck,
        ModelCardCallback,
        add_stateful_loss_callback,
    )

    timer = StepTimer()
    stop = [StopAfterSteps(config.stop_after_steps)] if config.stop_after_steps else []
    args = training_arguments(config, with_evaluator=evaluator is not None)
    # rotation among this run's own checkpoints only: transformers' would delete every checkpoint-* folder it finds
    ledger = CheckpointLedgerCallback(args.save_total_limit)
    args.save_total_limit = None
    _check_some_steps(train_dataset, args)
    model_check = LossModelCheck(loss)
    model_check.check(model)  # before the Trainer exists: a loss of another model is named before any work
    trainer = SentenceTransformerTrainer(
        model=model,
        args=args,
        train_dataset=train_dataset,
        loss=loss,
        evaluator=evaluator if args.eval_strategy != "no" else None,
        # the ledger last: it sees every callback's decision to save, and records the files they write into a checkpoint
        callbacks=[timer, EvaluateAtEnd(), model_check, ModelCardCallback(loss), *stop, *(callbacks or []), ledger],
    )
    add_stateful_loss_callback(trainer)  # stateful losses (AdCSE) restore their state on resume
    if args.disable_tqdm:  # no progress bar: the Trainer's log dicts go to the log (stderr), not to stdout
        from transformers.trainer_callback import PrinterCallback

        if trainer.pop_callback(PrinterCallback) is not None:
            trainer.add_callback(LogsToLogger())
    start = time.perf_counter()
    # TrainingArguments.resume_from_checkpoint is only a field; the Trainer resumes when train() is given it
    trainer.train(resume_from_checkpoint=args.resume_from_checkpoint or None)
    seconds = time.perf_counter() - start
    if trainer.state.global_step < 1:
        raise RuntimeError(
            f"training made 0 optimizer steps on {_rows(train_dataset)} rows (batch size {args.per_device_train_batch_size}"
            f", dataloader_drop_last={args.dataloader_drop_last}): the model is untrained. Use more data or a smaller "
            "batch size (BatchSamplers.NO_DUPLICATES needs enough distinct texts to fill a batch).")
    return TrainResult(
        train_seconds=seconds,
        steps=trainer.state.global_step,
        median_step_seconds=timer.median(),
        step_seconds=timer.step_seconds,
        best_metric=trainer.state.best_metric,
        best_checkpoint=trainer.state.best_model_checkpoint,
        log_history=list(trainer.state.log_history),
        checkpoints=list(ledger.written),
    )


# --------------------------------------------------------------------------- checks before any model loads
def check_precision(extra_args: dict[str, Any]) -> dict[str, Any]:
    """Check ``bf16`` / ``fp16`` of ``extra_args`` against this machine before any model loads; returns
    ``extra_args``, with ``use_cpu=True`` added for ``bf16`` on a machine without a GPU (CPU autocast, which the
    Trainer otherwise refuses with "Your setup doesn't support bf16/gpu").

    Raises:
        ValueError: ``bf16`` on a GPU without bfloat16 (or a CPU build of torch without it), ``fp16`` without a
            CUDA GPU, or both.
    """
    import torch

    bf16, fp16 = bool(extra_args.get("bf16")), bool(extra_args.get("fp16"))
    if bf16 and fp16:
        raise ValueError("bf16 and fp16 are exclusive: choose one")
    cpu = bool(extra_args.get("use_cpu")) or not torch.cuda.is_available()
    if bf16:
        if not cpu and not torch.cuda.is_bf16_supported():
            raise ValueError(f"bf16=true: this GPU ({torch.cuda.get_device_name()}) cannot compute in bfloat16; use "
                             "fp16=true or neither")
        if cpu:
            from transformers.utils import is_torch_bf16_available_on_device

            if not is_torch_bf16_available_on_device("cpu"):
                raise ValueError("bf16=true: this machine has no GPU and torch cannot run bfloat16 on its CPU")
            return {**extra_args, "use_cpu": True}
    if fp16 and cpu:
        raise ValueError("fp16=true needs a CUDA GPU and this run has none; use bf16=true on a CPU")
    return extra_args


def check_hub_access(extra_args: dict[str, Any]) -> None:
    """``push_to_hub=True`` needs ``hub_model_id``, a token and the Hub within reach: checked before any model
    loads (the Trainer would otherwise train for hours and fail at its first push).

    Raises:
        ValueError: no ``hub_model_id``, ``HF_HUB_OFFLINE`` set, no token, or the Hub not reachable with it.
    """
    if not extra_args.get("push_to_hub"):
        if extra_args.get("hub_model_id"):
            raise ValueError("hub_model_id is set but push_to_hub is not: add push_to_hub=true or drop hub_model_id")
        return
    if not extra_args.get("hub_model_id"):
        raise ValueError("push_to_hub=true needs hub_model_id=USER/NAME: the repository to push to")
    from huggingface_hub import constants, get_token

    if constants.HF_HUB_OFFLINE:
        raise ValueError("push_to_hub=true, but HF_HUB_OFFLINE is set: this run cannot reach the Hugging Face Hub")
    token = extra_args.get("hub_token") or get_token()
    if not token:
        raise ValueError("push_to_hub=true needs a Hugging Face token: run `hf auth login`, set HF_TOKEN, or pass "
                         "hub_token=...")
    from huggingface_hub import HfApi

    try:
        HfApi().whoami(token=token)
    except Exception as exc:  # no network, a revoked token: either way nothing could be pushed
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"push_to_hub=true, but the Hugging Face Hub does not answer with this token: {first}") \
            from None


def find_checkpoint(path: str, run: dict[str, Any] | None = None, option: str = "resume_from_checkpoint") -> str:
    """The checkpoint folder to resume from: ``path`` itself (a folder with ``trainer_state.json``) or the latest
    ``checkpoint-N`` inside it; with ``run`` (``{"loss": ..., "loss_args": ...}``), the checkpoint must have been
    written by a run of the same loss and loss arguments (its :data:`CHECKPOINT_RUN_FILE`).

    Raises:
        ValueError: no such folder, no checkpoint in it, or a checkpoint of another loss or other loss arguments.
    """
    import json
    from pathlib import Path

    from transformers.trainer_utils import get_last_checkpoint

    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise ValueError(f"{option} {folder}: no such folder")
    if not (folder / "trainer_state.json").is_file():
        last = get_last_checkpoint(str(folder))
        if last is None:
            raise ValueError(f"{option} {folder} holds no checkpoint (no trainer_state.json, no checkpoint-N folder)")
        folder = Path(last)
    if run is not None:
        info_file = folder / CHECKPOINT_RUN_FILE
        if not info_file.is_file():
            raise ValueError(f"{option} {folder} was not written by st-hardneg train (no {CHECKPOINT_RUN_FILE}): its "
                             "loss is unknown")
        try:
            saved = json.loads(info_file.read_text(encoding="utf-8"))
            if not isinstance(saved, dict):
                raise ValueError("not a JSON object")
        except (ValueError, UnicodeDecodeError) as exc:
            raise ValueError(f"{option}: {info_file} is damaged ({str(exc).splitlines()[0]}); it records the loss "
                             "of the checkpoint: resume from another checkpoint") from None
        for key in ("loss", "loss_args"):
            if json.dumps(saved.get(key), sort_keys=True) != json.dumps(run.get(key), sort_keys=True, default=str):
                raise ValueError(f"{option} {folder} is a checkpoint of {key} {saved.get(key)!r}, this run trains "
                                 f"{run.get(key)!r}: resume with the same loss and loss arguments")
    return str(folder)
